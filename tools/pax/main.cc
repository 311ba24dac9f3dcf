// pax: run declarative experiments (see docs/pax.md).
//
//   pax list
//   pax train --exp=copy.TransformerLmTiny --job_log_dir=/tmp/job --set train.steps=50
#include "parallax/pax.h"
#ifdef PX_WITH_CUDA_BACKEND
#include "backend/cuda/backend.h"
#endif

int main(int argc, char** argv) {
#ifdef PX_WITH_CUDA_BACKEND
  px::cuda::provide_cuda_platform();  // --devices=cuda / PX_DEVICES=cuda: registered when named
#endif
  return px::pax::cli_main(argc, argv);
}
