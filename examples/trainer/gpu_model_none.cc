// The trainer built without the GPU half (no CUDA toolkit or no cuBLAS at configure time):
// --device cuda is refused with this message.
#include "examples/trainer/gpu_model.h"

namespace trainer {

bool gpuModelBuilt() { return false; }
int gpuCount() { return 0; }
bool selectGpu(int, std::string* error) {
  *error = "--device cuda: this tutti-train was built without CUDA and cuBLAS; use --device cpu";
  return false;
}

std::unique_ptr<GpuModel> GpuModel::create(ncclComm_t, const std::vector<Layer>&, int, int,
                                           std::vector<Bucket>, ncclDataType_t, bool,
                                           std::string* error) {
  *error =
      "--device cuda: this tutti-train was built without CUDA and cuBLAS (configure with the "
      "CUDA toolkit installed to get the GPU half); use --device cpu";
  return nullptr;
}

}  // namespace trainer
