# Shared by the bench/paired_*.sh scripts (sourced): checks the arguments, then runs a bench
# binary of two builds in interleaved rounds, alternating which build runs first, and writes each
# JSON line it prints as "ROUND BUILD JSON" (BUILD: old or new) to the file $rows.
#   paired_args BENCH OLD_BUILD_DIR NEW_BUILD_DIR ROUNDS   (sets OLD, NEW, ROUNDS; exits 2 on bad ones)
#   paired_run BENCH [bench flags...]                      (ROWS=FILE keeps the lines there)
paired_args() {
  local bench=$1
  OLD=${2:?old build dir}
  NEW=${3:?new build dir}
  ROUNDS=$4
  for b in "$OLD" "$NEW"; do
    [ -x "$b/bench/$bench" ] || { echo "no $b/bench/$bench: build the $bench target there first" >&2; exit 2; }
  done
  [[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "rounds: a positive whole number, not '$ROUNDS'" >&2; exit 2; }
}

paired_run() {
  local bench=$1 i w dir order
  shift
  if [ -n "${ROWS:-}" ]; then
    rows=$ROWS; : > "$rows"
  else
    rows=$(mktemp); trap 'rm -f "$rows"' EXIT
  fi
  for i in $(seq 1 "$ROUNDS"); do
    if (( i % 2 )); then order="old new"; else order="new old"; fi
    for w in $order; do
      dir=$NEW; [ "$w" = old ] && dir=$OLD
      "$dir/bench/$bench" "$@" | grep '^{' | sed "s/^/$i $w /" >> "$rows"
    done
  done
}
