#!/bin/sh
# Two "machines" on this one: two network namespaces (each with its own host name) joined by a
# veth pair, and mpirun starting one rank in each over Open MPI's TCP transport, with an agent
# that enters the other namespace where a cluster would use ssh. Runs the MPI training tests
# there (ctest: distributed_mpi_two_nodes_tcp). Exits 77 (skipped) where this machine does not
# let us create network namespaces (not root, or a container without CAP_SYS_ADMIN).
#   two_nodes.sh MPIRUN TEST_BINARY GTEST_FILTER
set -u
mpirun=$1 binary=$2 filter=$3
tag=px$$
a=${tag}a b=${tag}b
dir=$(mktemp -d)
cleanup() {
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM
skip() {
  echo "two_nodes: skipped: $1"
  exit 77
}
command -v ip >/dev/null 2>&1 || skip "no 'ip' command (iproute2)"
command -v unshare >/dev/null 2>&1 || skip "no 'unshare' command (util-linux)"
ip netns add "$a" 2>/dev/null || skip "cannot create a network namespace here (needs root with CAP_SYS_ADMIN)"
ip netns add "$b" || exit 1
ip link add "${tag}va" type veth peer name "${tag}vb" || skip "cannot create a veth pair here"
ip link set "${tag}va" netns "$a" && ip link set "${tag}vb" netns "$b" &&
  ip -n "$a" addr add 10.77.0.1/24 dev "${tag}va" && ip -n "$b" addr add 10.77.0.2/24 dev "${tag}vb" &&
  ip -n "$a" link set "${tag}va" up && ip -n "$b" link set "${tag}vb" up &&
  ip -n "$a" link set lo up && ip -n "$b" link set lo up || exit 1
unshare --uts true 2>/dev/null || skip "cannot create a UTS namespace (own host name) here"

# Open MPI's remote shell: "agent HOST COMMAND..." runs COMMAND on the node at HOST.
cat >"$dir/agent" <<AGENT
#!/bin/sh
host=\$1; shift
case \$host in
  10.77.0.1) ns=$a; name=${tag}-node0 ;;
  10.77.0.2) ns=$b; name=${tag}-node1 ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns unshare --uts sh -c "hostname \$name; \$*"
AGENT
chmod +x "$dir/agent"

exec_in_a="ip netns exec $a unshare --uts sh -c"
$exec_in_a "hostname ${tag}-node0; PX_DEVICES=cpu:2 OMP_NUM_THREADS=1 PX_COLLECTIVE_TIMEOUT_S=120 \
  $mpirun -np 2 --host 10.77.0.1,10.77.0.2 -x PX_DEVICES -x OMP_NUM_THREADS -x PX_COLLECTIVE_TIMEOUT_S \
  --allow-run-as-root --oversubscribe --mca plm_rsh_agent $dir/agent \
  --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
  $binary --gtest_filter=$filter"
