// Long-lived helper threads: one per extra channel of a communicator, plus a runner that
// executes the communicator's share of a multi-communicator group. A task is handed over
// and waited for; the threads sleep on a condition variable in between.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace tutti {

class Worker {
 public:
  explicit Worker(int device) : device_(device) {}
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Starts fn on the worker thread (starting the thread on first use).
  void post(std::function<void()> fn);
  // Waits for the posted task to finish.
  void wait();

 private:
  void loop();
  int device_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> task_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tutti
