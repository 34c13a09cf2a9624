#include "kernels/cpu/ring_dispatch.h"

#include <cstring>

#include "kernels/cpu/host_prims.h"
#include "kernels/cpu/reduce.h"
#include "nccl.h"

namespace tutti::cpu {
namespace {

template <typename T, RedFn F>
void runReduction(const CollArgs& op, Algo algo, const algo::RingArgs& ra,
                  transport::FifoView* sendTo, transport::FifoView* recvFrom, Waiter* w) {
  using E = Elem<T>;
  Reducer<T, F> fn;
  if (op.red.pre) {
    T s;
    memcpy(&s, op.red.scalarPtr ? op.red.scalarPtr : op.red.scalar, sizeof(T));
    fn.hasPre = true;
    fn.preScalar = E::load(s);
  }
  if (op.red.post) {
    fn.hasPost = true;
    fn.postDivisor = static_cast<typename E::Acc>(ra.nranks);
  }
  HostPrims<T, Reducer<T, F>> p(sendTo, recvFrom, static_cast<const T*>(op.send),
                                static_cast<T*>(op.recv), fn, w);
  switch (op.kind) {
    case CollKind::kAllReduce:
      if (algo == Algo::kPair) {
        algo::pairAllReduce(p, ra);
      } else {
        algo::ringAllReduce(p, ra);
      }
      break;
    case CollKind::kReduceScatter:
      algo::ringReduceScatter(p, ra);
      break;
    case CollKind::kReduce:
      algo::ringReduce(p, ra);
      break;
    default:
      break;
  }
}

template <typename T>
void byFn(const CollArgs& op, Algo algo, const algo::RingArgs& ra, transport::FifoView* s,
          transport::FifoView* r, Waiter* w) {
  switch (static_cast<RedFn>(op.red.fn)) {
    case RedFn::kSum:
      return runReduction<T, RedFn::kSum>(op, algo, ra, s, r, w);
    case RedFn::kProd:
      return runReduction<T, RedFn::kProd>(op, algo, ra, s, r, w);
    case RedFn::kMax:
      return runReduction<T, RedFn::kMax>(op, algo, ra, s, r, w);
    case RedFn::kMin:
      return runReduction<T, RedFn::kMin>(op, algo, ra, s, r, w);
  }
}

}  // namespace

bool movesBytes(CollKind kind) {
  return kind == CollKind::kAllGather || kind == CollKind::kBroadcast;
}

void runRingChannel(const CollArgs& op, Algo algo, const algo::RingArgs& ra, transport::FifoView* s,
                    transport::FifoView* r, Waiter* w) {
  if (movesBytes(op.kind)) {
    HostPrims<uint8_t, CopyOnly> p(s, r, static_cast<const uint8_t*>(op.send),
                                   static_cast<uint8_t*>(op.recv), CopyOnly{}, w);
    if (op.kind == CollKind::kAllGather) {
      algo::ringAllGather(p, ra);
    } else {
      algo::ringBroadcast(p, ra);
    }
    return;
  }
  switch (op.dtype) {
    case ncclInt8:
      return byFn<int8_t>(op, algo, ra, s, r, w);
    case ncclUint8:
      return byFn<uint8_t>(op, algo, ra, s, r, w);
    case ncclInt32:
      return byFn<int32_t>(op, algo, ra, s, r, w);
    case ncclUint32:
      return byFn<uint32_t>(op, algo, ra, s, r, w);
    case ncclInt64:
      return byFn<int64_t>(op, algo, ra, s, r, w);
    case ncclUint64:
      return byFn<uint64_t>(op, algo, ra, s, r, w);
    case ncclFloat16:
      return byFn<half_t>(op, algo, ra, s, r, w);
    case ncclFloat32:
      return byFn<float>(op, algo, ra, s, r, w);
    case ncclFloat64:
      return byFn<double>(op, algo, ra, s, r, w);
    case ncclBfloat16:
      return byFn<bf16_t>(op, algo, ra, s, r, w);
    case ncclFloat8e4m3:
      return byFn<fp8e4m3_t>(op, algo, ra, s, r, w);
    case ncclFloat8e5m2:
      return byFn<fp8e5m2_t>(op, algo, ra, s, r, w);
    default:
      w->fail(internalError("unknown datatype " + std::to_string(op.dtype)));
  }
}

}  // namespace tutti::cpu
