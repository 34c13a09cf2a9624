#include "runtime/waiter.h"

#include <time.h>

#include "runtime/comm.h"
#include "runtime/dtype.h"

namespace tutti {

OpState::OpState(const Comm& comm, const CollArgs* op, uint64_t seq, size_t groupSize,
                 double timeoutS)
    : comm_(comm), op_(op), seq_(seq), groupSize_(groupSize), timeoutS_(timeoutS) {}

std::string OpState::what() const {
  if (!op_) {
    return "group of " + std::to_string(groupSize_) + " send/recv (seq " + std::to_string(seq_) +
           ")";
  }
  std::string s = std::string(op_->name) + " seq " + std::to_string(seq_) + " (" +
                  std::to_string(op_->count) + " x " + dtypeName(op_->dtype);
  if (op_->op >= 0) s += std::string(", ") + redOpName(op_->op);
  if (op_->kind == CollKind::kBroadcast || op_->kind == CollKind::kReduce) {
    s += ", root " + std::to_string(op_->root);
  }
  return s + ")";
}

void OpState::fail(const Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load()) return;
  first_ = s;
  failed_.store(true, std::memory_order_release);
}

Status OpState::status() const {
  if (!failed()) return Status::Ok();  // first_ is written only before failed_ is set
  std::lock_guard<std::mutex> lock(mu_);
  return first_;
}

void Waiter::nap() {
  timespec ts{0, 50 * 1000};
  nanosleep(&ts, nullptr);
}

std::string Waiter::where(const transport::FifoView& f, const char* dir) const {
  return "rank " + std::to_string(op_->comm().rank()) + ": " + op_->what() + ", " + dir + " rank " +
         std::to_string(f.peer) + " (channel " + std::to_string(f.channel) + ")";
}

void Waiter::failAt(const transport::FifoView& f, Dir d, const Status& s) {
  op_->fail(Status(
      s.code(), where(f, d == Dir::kSend ? "sending to" : "receiving from") + ": " + s.message()));
}

Status Waiter::problem(const transport::FifoView& f, const char* dir, Clock::time_point* since) {
  if (op_->failed()) return op_->status();
  const Comm& comm = op_->comm();
  // Messages are built only when something failed: this runs often while a rank waits.
  auto where = [&] { return this->where(f, dir); };
  if (comm.aborted()) {
    return internalError(where() + ": the communicator was aborted (ncclCommAbort)");
  }
  auto now = Clock::now();
  if (since->time_since_epoch().count() == 0) *since = now;
  // Health checks cost system calls (shm: kill + /proc): only for waits that have already
  // lasted a while, and then at most every 50 ms.
  if (now - *since >= std::chrono::milliseconds(1) && now >= nextHealth_) {
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
