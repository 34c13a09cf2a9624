// Collective and point-to-point entry points. Every argument is validated here, before
// anything is queued; then the operation runs (or joins the current group) on the CPU engine.
// AlltoAll, Gather and Scatter are grouped sends and receives.
#include <climits>
#include <cstdint>

#include "bindings/c/api_common.h"
#include "kernels/cuda/kernel_table.h"
#include "runtime/cuda_shim.h"
#include "runtime/group.h"

using namespace tutti;
using tutti::api::fail;

namespace {

constexpr int kNone = INT_MIN;

enum class Kind {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAlltoAll,
  kGather,
  kScatter,
  kSend,
  kRecv
};

struct Call {
  const char* fn;
  Kind kind;
  const void* send;
  const void* recv;
  size_t count;
  int dtype;
  int op;    // kNone: not a reduction
  int root;  // root or peer; kNone: neither
  ncclComm_t comm;
  cudaStream_t stream;
};

bool scalesWithRanks(Kind k) {
  return k == Kind::kAllGather || k == Kind::kReduceScatter || k == Kind::kAlltoAll ||
         k == Kind::kGather || k == Kind::kScatter;
}

// comm is pinned by the caller.
Status validate(const Call& c, Comm* comm, RedOpSpec* red, bool* device) {
  // Pinned, so live: only its state is left to check (api::lookup without the registry).
  if (comm->state() != Comm::State::kReady) {
    TUTTI_ASSIGN(ready, api::lookup(comm, api::Need::kReady));
    (void)ready;
  }
  size_t size = api::typeSize(c.dtype);
  if (size == 0) {
    return invalidArgument("datatype " + std::to_string(c.dtype) +
                           " is not a valid ncclDataType_t");
  }
  if (c.op != kNone && c.op < 0) {
    return invalidArgument("reduction op " + std::to_string(c.op) + " is not a valid ncclRedOp_t");
  }
  if (c.root != kNone) {
    const char* what = (c.kind == Kind::kSend || c.kind == Kind::kRecv) ? "peer" : "root";
    if (c.root < 0 || c.root >= comm->nranks()) {
      return invalidArgument(std::string(what) + " " + std::to_string(c.root) +
                             " is out of range for a communicator of " +
                             std::to_string(comm->nranks()) + " ranks");
    }
  }
  size_t elems = c.count;
  if (scalesWithRanks(c.kind)) {
    if (elems > SIZE_MAX / static_cast<size_t>(comm->nranks())) {
      return invalidArgument("count " + std::to_string(c.count) + " x " +
                             std::to_string(comm->nranks()) + " ranks overflows");
    }
    elems *= static_cast<size_t>(comm->nranks());
  }
  if (elems > SIZE_MAX / size || elems * size > static_cast<size_t>(INT64_MAX)) {
    return invalidArgument("count " + std::to_string(c.count) + " of " + api::typeName(c.dtype) +
                           " overflows the addressable size");
  }
  if (c.count > 0) {
    bool needSend = c.kind != Kind::kRecv;
    bool needRecv = c.kind != Kind::kSend;
    // Only the root's receive buffer matters for Reduce / Gather, only its send for Scatter.
    if ((c.kind == Kind::kReduce || c.kind == Kind::kGather) && comm->rank() != c.root)
      needRecv = false;
    // Broadcast and Scatter read the send buffer on the root only.
    if ((c.kind == Kind::kScatter || c.kind == Kind::kBroadcast) && comm->rank() != c.root)
      needSend = false;
    if (needSend && !c.send) return invalidArgument("sendbuff is NULL with count > 0");
    if (needRecv && !c.recv) return invalidArgument("recvbuff is NULL with count > 0");
    // Host buffers run on the CPU engine, GPU buffers as kernels; never one of each.
    const cuda::PointerKind sendKind = needSend ? cuda::pointerKind(c.send) : cuda::PointerKind{};
    const cuda::PointerKind recvKind = !needRecv                      ? cuda::PointerKind{}
                                       : needSend && c.recv == c.send ? sendKind  // in place
                                                                      : cuda::pointerKind(c.recv);
    if (needSend && needRecv && sendKind.device != recvKind.device) {
      return invalidUsage(std::string(sendKind.device ? "sendbuff" : "recvbuff") +
                          " is GPU memory but " + (sendKind.device ? "recvbuff" : "sendbuff") +
                          " is host memory: both must be of one kind");
    }
    *device = sendKind.device || recvKind.device;
    if (*device && comm->cudaDev() < 0) {
      return invalidUsage("GPU buffers on rank " + std::to_string(comm->rank()) +
                          ", a CPU rank (its communicator has no CUDA device)");
    }
    for (auto [p, kind] : {std::pair{c.send, sendKind}, std::pair{c.recv, recvKind}}) {
      if (kind.gpu >= 0 && kind.gpu != comm->cudaDev()) {
        return invalidUsage("buffer " + std::to_string(reinterpret_cast<uintptr_t>(p)) +
                            " is memory of GPU " + std::to_string(kind.gpu) + " but rank " +
                            std::to_string(comm->rank()) + "'s communicator is on GPU " +
                            std::to_string(comm->cudaDev()));
      }
    }
  }
  if (c.op != kNone) {
    TUTTI_ASSIGN(spec, comm->resolveOp(c.op, c.dtype));
    *red = spec;
  }
  if (*device && c.op != kNone && !dev::kernelFor(c.dtype, red->fn, 0)) {
    return invalidUsage(
        "this tutti build has no device kernel for " + std::string(api::typeName(c.dtype)) +
        " (kernels built for: " + dev::builtKernelTypes() + "; see TUTTI_KERNEL_FILTER)");
  }
  return Status::Ok();
}

CollArgs argsFor(const Call& c, Kind kind, const void* send, void* recv, int root,
                 const RedOpSpec& red, bool device) {
  static const CollKind kMap[] = {
      CollKind::kAllReduce, CollKind::kAllGather, CollKind::kReduceScatter, CollKind::kBroadcast,
      CollKind::kReduce,    CollKind::kSend,      CollKind::kSend,          CollKind::kSend,
      CollKind::kSend,      CollKind::kRecv};
  return CollArgs{kMap[static_cast<int>(kind)],
                  c.fn,
                  send,
                  recv,
                  c.count,
                  c.dtype,
                  c.op == kNone ? -1 : c.op,
                  red,
                  root,
                  static_cast<void*>(c.stream),
                  device};
}

// AlltoAll, Gather and Scatter as the sends and receives they are made of.
std::vector<CollArgs> expand(const Call& c, Comm* comm, const RedOpSpec& red, bool device) {
  std::vector<CollArgs> ops;
  const int n = comm->nranks(), me = comm->rank();
  const size_t block = c.count * api::typeSize(c.dtype);
  auto at = [&](const void* base, int r) {
    return static_cast<char*>(const_cast<void*>(base)) + block * static_cast<size_t>(r);
  };
  switch (c.kind) {
    case Kind::kAlltoAll:
      for (int r = 0; r < n; ++r) {
        ops.push_back(argsFor(c, Kind::kSend, at(c.send, r), nullptr, r, red, device));
        ops.push_back(argsFor(c, Kind::kRecv, nullptr, at(c.recv, r), r, red, device));
      }
      break;
    case Kind::kGather:
      ops.push_back(argsFor(c, Kind::kSend, c.send, nullptr, c.root, red, device));
      if (me == c.root) {
        for (int r = 0; r < n; ++r)
          ops.push_back(argsFor(c, Kind::kRecv, nullptr, at(c.recv, r), r, red, device));
      }
      break;
    case Kind::kScatter:
      if (me == c.root) {
        for (int r = 0; r < n; ++r)
          ops.push_back(argsFor(c, Kind::kSend, at(c.send, r), nullptr, r, red, device));
      }
      ops.push_back(
          argsFor(c, Kind::kRecv, nullptr, const_cast<void*>(c.recv), c.root, red, device));
      break;
    default:
      ops.push_back(argsFor(c, c.kind, c.send, const_cast<void*>(c.recv), c.root, red, device));
  }
  return ops;
}

ncclResult_t enqueue(const Call& c) {
  Comm* comm = registry::pin(c.comm);
  if (!comm) {
    Result<Comm*> why = api::lookup(c.comm, api::Need::kAny);
    return fail(c.fn,
                why.ok() ? invalidArgument("comm was destroyed during the call") : why.status());
  }
  RedOpSpec red;
  bool device = false;
  if (Status s = validate(c, comm, &red, &device); !s.ok()) {
    comm->unpin();
    return fail(c.fn, s);
  }
  if (c.count == 0) {  // nothing to move: no engine, no kernel (its buffers may be anything)
    comm->unpin();
    return ncclSuccess;
  }
  Status s;
  if (c.kind == Kind::kAlltoAll || c.kind == Kind::kGather || c.kind == Kind::kScatter) {
    std::vector<CollArgs> ops = expand(c, comm, red, device);
    s = group::submit(comm, ops.data(), ops.size());
  } else {  // the common case: one operation, no allocation
    CollArgs op = argsFor(c, c.kind, c.send, const_cast<void*>(c.recv), c.root, red, device);
    s = group::submit(comm, &op, 1);
  }
  if (!s.ok()) return fail(c.fn, s);
  return ncclSuccess;
}

}  // namespace

TUTTI_API ncclResult_t ncclAllReduce(const void* s, void* r, size_t count, ncclDataType_t t,
                                     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue({"ncclAllReduce", Kind::kAllReduce, s, r, count, t, op, kNone, comm, stream});
}

TUTTI_API ncclResult_t ncclAllGather(const void* s, void* r, size_t count, ncclDataType_t t,
                                     ncclComm_t comm, cudaStream_t stream) {
  return enqueue({"ncclAllGather", Kind::kAllGather, s, r, count, t, kNone, kNone, comm, stream});
}

TUTTI_API ncclResult_t ncclReduceScatter(const void* s, void* r, size_t count, ncclDataType_t t,
                                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(
      {"ncclReduceScatter", Kind::kReduceScatter, s, r, count, t, op, kNone, comm, stream});
}

TUTTI_API ncclResult_t ncclBroadcast(const void* s, void* r, size_t count, ncclDataType_t t,
                                     int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue({"ncclBroadcast", Kind::kBroadcast, s, r, count, t, kNone, root, comm, stream});
}

TUTTI_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t t, int root,
                                 ncclComm_t comm, cudaStream_t stream) {
  return enqueue({"ncclBcast", Kind::kBroadcast, buff, buff, count, t, kNone, root, comm, stream});
}

TUTTI_API ncclResult_t ncclReduce(const void* s, void* r, size_t count, ncclDataType_t t,
                                  ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue({"ncclReduce", Kind::kReduce, s, r, count, t, op, root, comm, stream});
}

TUTTI_API ncclResult_t ncclAlltoAll(const void* s, void* r, size_t count, ncclDataType_t t,
                                    ncclComm_t comm, cudaStream_t stream) {
  return enqueue({"ncclAlltoAll", Kind::kAlltoAll, s, r, count, t, kNone, kNone, comm, stream});
}

TUTTI_API ncclResult_t ncclGather(const void* s, void* r, size_t count, ncclDataType_t t, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  return enqueue({"ncclGather", Kind::kGather, s, r, count, t, kNone, root, comm, stream});
}

TUTTI_API ncclResult_t ncclScatter(const void* s, void* r, size_t count, ncclDataType_t t, int root,
                                   ncclComm_t comm, cudaStream_t stream) {
  return enqueue({"ncclScatter", Kind::kScatter, s, r, count, t, kNone, root, comm, stream});
}

TUTTI_API ncclResult_t ncclSend(const void* s, size_t count, ncclDataType_t t, int peer,
                                ncclComm_t comm, cudaStream_t stream) {
  return enqueue({"ncclSend", Kind::kSend, s, nullptr, count, t, kNone, peer, comm, stream});
}

TUTTI_API ncclResult_t ncclRecv(void* r, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                                cudaStream_t stream) {
  return enqueue({"ncclRecv", Kind::kRecv, nullptr, r, count, t, kNone, peer, comm, stream});
}
