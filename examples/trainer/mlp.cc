#include "examples/trainer/mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "examples/trainer/rng.h"

namespace trainer {

Mlp::Mlp(std::vector<int> dims, int max_batch) : dims_(std::move(dims)), max_batch_(max_batch) {
  size_t off = 0;
  int widest = 0;
  for (size_t l = 0; l + 1 < dims_.size(); ++l) {
    Layer layer;
    layer.in = dims_[l];
    layer.out = dims_[l + 1];
    layer.weight = off;
    layer.bias = off + size_t(layer.in) * size_t(layer.out);
    off = layer.end();
    layers_.push_back(layer);
    act_.emplace_back(size_t(max_batch_) * size_t(layer.out));
    widest = std::max(widest, layer.out);
  }
  num_params_ = off;
  delta_.resize(size_t(max_batch_) * size_t(widest));
  delta_next_.resize(delta_.size());
}

void Mlp::initParams(const std::vector<Layer>& layers, uint64_t seed, float* params) {
  Rng rng(seed, /*stream=*/0x1417);
  for (const Layer& l : layers) {
    const float bound = std::sqrt(6.0f / float(l.in));
    for (size_t i = 0; i < size_t(l.in) * size_t(l.out); ++i) {
      params[l.weight + i] = (2.0f * rng.uniform() - 1.0f) * bound;
    }
    std::fill(params + l.bias, params + l.end(), 0.0f);
  }
}

double Mlp::forward(const float* params, const float* x, const uint8_t* labels, int n,
                    int* correct) {
  n_ = std::min(n, max_batch_);
  x_ = x;
  labels_ = labels;
  const float* in = x;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    float* out = act_[l].data();
    // out = in * W^T + b: start from the bias rows, then let GEMM accumulate onto them.
    for (int i = 0; i < n_; ++i)
      std::copy(params + L.bias, params + L.end(), out + size_t(i) * L.out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_, L.out, L.in, 1.0f, in, L.in,
                params + L.weight, L.in, 1.0f, out, L.out);
    if (l + 1 < layers_.size()) {
      for (size_t i = 0; i < size_t(n_) * size_t(L.out); ++i) out[i] = std::max(out[i], 0.0f);
    }
    in = out;
  }
  // Softmax cross-entropy on the logits, computed stably (shifted by the row maximum). The
  // logits buffer is turned into the probabilities backward() needs.
  const int classes = layers_.back().out;
  float* logits = act_.back().data();
  double loss = 0;
  int right = 0;
  for (int i = 0; i < n_; ++i) {
    float* row = logits + size_t(i) * classes;
    int best = int(std::max_element(row, row + classes) - row);
    float mx = row[best];
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(double(row[c] - mx));
    loss += std::log(sum) - double(row[labels[i]] - mx);
    right += best == labels[i];
    const float inv = float(1.0 / sum);
    for (int c = 0; c < classes; ++c) row[c] = std::exp(row[c] - mx) * inv;
  }
  if (correct) *correct = right;
  return loss;
}

void Mlp::backward(const float* params, float scale, float* grads,
                   const std::function<void(int)>& on_layer_done) {
  const int classes = layers_.back().out;
  // d(loss)/d(logits) = softmax - onehot, scaled (the mean over the global batch).
  const float* prob = act_.back().data();
  for (int i = 0; i < n_; ++i) {
    for (int c = 0; c < classes; ++c) {
      size_t k = size_t(i) * classes + c;
      delta_[k] = scale * (prob[k] - (c == labels_[i] ? 1.0f : 0.0f));
    }
  }
  for (int l = int(layers_.size()) - 1; l >= 0; --l) {
    const Layer& L = layers_[size_t(l)];
    const float* in = l == 0 ? x_ : act_[size_t(l) - 1].data();
    // dW += delta^T * in ; db += column sums of delta.
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L.out, L.in, n_, 1.0f, delta_.data(),
                L.out, in, L.in, 1.0f, grads + L.weight, L.in);
    float* db = grads + L.bias;
    for (int i = 0; i < n_; ++i) {
      const float* d = delta_.data() + size_t(i) * L.out;
      for (int j = 0; j < L.out; ++j) db[j] += d[j];
    }
    if (l > 0) {
      // The input's gradient, through the ReLU of the layer below: delta W, masked where the
      // activation was clipped to zero.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_, L.in, L.out, 1.0f, delta_.data(),
                  L.out, params + L.weight, L.in, 0.0f, delta_next_.data(), L.in);
      for (size_t i = 0; i < size_t(n_) * size_t(L.in); ++i) {
        if (in[i] <= 0.0f) delta_next_[i] = 0.0f;
      }
      delta_.swap(delta_next_);
    }
    if (on_layer_done) on_layer_done(l);
  }
}

}  // namespace trainer
