// Threads of one process that meet before going on (a reusable barrier; C++17 has none): the
// rank threads of tests and of tutti-perf -t N.
#pragma once

#include <condition_variable>
#include <mutex>

namespace tutti {

class ThreadBarrier {
 public:
  explicit ThreadBarrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const long gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  long gen_ = 0;
};

}  // namespace tutti
