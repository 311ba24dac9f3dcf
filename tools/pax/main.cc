// pax: run declarative experiments (see docs/pax.md).
//
//   pax list
//   pax train --exp=copy.TransformerLmTiny --job_log_dir=/tmp/job --set train.steps=50
#include "parallax/pax.h"

int main(int argc, char** argv) { return px::pax::cli_main(argc, argv); }
