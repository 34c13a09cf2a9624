#include "runtime/workers.h"

#include "runtime/cuda_shim.h"
#include "runtime/log.h"

namespace tutti {

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Worker::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = std::move(fn);
    busy_ = true;
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_all();
}

void Worker::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
}

void Worker::loop() {
  log::setThreadDevice(device_);
  // The communicator's GPU current, as on its init thread (Comm::startAsync): a thread that
  // never chose one has GPU 0 current, and a DeviceGuard that restored that (after preparing
  // a group's part, say) made GPU 0's context in a process that never meant to use GPU 0.
  if (device_ >= 0) (void)cuda::setDevice(device_);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || (busy_ && task_); });
    if (stop_ && !busy_) return;
    std::function<void()> fn = std::move(task_);
    task_ = nullptr;
    lock.unlock();
    fn();
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace tutti
