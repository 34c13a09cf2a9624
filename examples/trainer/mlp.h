// A multi-layer perceptron (Linear -> ReLU -> ... -> Linear -> softmax cross-entropy) whose
// parameters and gradients each live in one flat float buffer, so that gradient buckets are
// plain slices of it, as in PyTorch DDP's flattened buckets.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace trainer {

struct Layer {
  int in = 0, out = 0;
  size_t weight = 0;  // offset of W (out x in, row-major) in the flat buffers
  size_t bias = 0;    // offset of b (out)
  size_t end() const { return bias + size_t(out); }
};

class Mlp {
 public:
  // dims = {inputs, hidden..., classes}; max_batch bounds the activations kept for backward.
  Mlp(std::vector<int> dims, int max_batch);

  const std::vector<int>& dims() const { return dims_; }
  const std::vector<Layer>& layers() const { return layers_; }
  size_t numParams() const { return num_params_; }

  // Deterministic initialisation (the same on every machine for a seed): W uniform in
  // +-sqrt(6 / fan_in) (He, for ReLU), biases zero.
  static void initParams(const std::vector<Layer>& layers, uint64_t seed, float* params);

  // Forward pass over n samples (x: n x dims[0]); keeps the activations for backward().
  // Returns the summed cross-entropy loss over the n samples and counts correct predictions.
  double forward(const float* params, const float* x, const uint8_t* labels, int n, int* correct);

  // Backward pass for the last forward(): adds scale * d(sum of losses)/d(params) into grads.
  // on_layer_done(l) runs as soon as layer l's gradients are final, last layer first: that is
  // when a gradient bucket can start its all-reduce.
  void backward(const float* params, float scale, float* grads,
                const std::function<void(int)>& on_layer_done);

 private:
  std::vector<int> dims_;
  std::vector<Layer> layers_;
  size_t num_params_ = 0;
  int max_batch_;
  int n_ = 0;                            // rows of the last forward pass
  const float* x_ = nullptr;             // its input
  const uint8_t* labels_ = nullptr;      // and labels
  std::vector<std::vector<float>> act_;  // act_[l]: output of layer l (after ReLU if hidden)
  std::vector<float> delta_, delta_next_;
};

}  // namespace trainer
