#include "runtime/waiter.h"

#include <time.h>

#include "runtime/comm.h"

namespace tutti {

OpState::OpState(const Comm& comm, std::string what, double timeoutS)
    : comm_(comm), what_(std::move(what)), timeoutS_(timeoutS) {}

void OpState::fail(const Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load()) return;
  first_ = s;
  failed_.store(true, std::memory_order_release);
}

Status OpState::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_;
}

void Waiter::nap() {
  timespec ts{0, 50 * 1000};
  nanosleep(&ts, nullptr);
}

Status Waiter::problem(const transport::FifoView& f, const char* dir, Clock::time_point* since) {
  if (op_->failed()) return op_->status();
  const Comm& comm = op_->comm();
  // Built only when something failed: this runs often while a rank waits.
  auto where = [&] {
    return "rank " + std::to_string(comm.rank()) + ": " + op_->what() + ", " + dir + " rank " +
           std::to_string(f.peer) + " (channel " + std::to_string(f.channel) + ")";
  };
  if (comm.aborted()) {
    return internalError(where() + ": the communicator was aborted (ncclCommAbort)");
  }
  auto now = Clock::now();
  if (since->time_since_epoch().count() == 0) *since = now;
  if (now >= nextHealth_) {
    nextHealth_ = now + std::chrono::milliseconds(50);
    if (f.conn) {
      Status h = f.conn->health();
      if (!h.ok()) {
        return Status(h.code(), where() + ": " + h.message());
      }
    }
  }
  if (now - *since >= std::chrono::duration<double>(op_->timeoutS())) {
    return timeoutError(where() + ": no progress within " + std::to_string(int(op_->timeoutS())) +
                        " s (TUTTI_TIMEOUT); rank " + std::to_string(f.peer) +
                        " has not reached this operation");
  }
  return Status::Ok();
}

}  // namespace tutti
