// Collective and point-to-point entry points. Every argument is validated here, before
// anything is queued; then the operation runs (or joins the current group) on the CPU engine.
// AlltoAll, Gather and Scatter are grouped sends and receives.
#include <climits>
#include <cstdint>

#include "bindings/c/api_common.h"
#include "kernels/cuda/kernel_table.h"
#include "runtime/cuda_shim.h"
#include "runtime/group.h"
#include "runtime/log.h"
#include "runtime/peer_info.h"

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

// What GPU buffers need, checked before anything is queued (later, a failure would break the
// communicator): the ranks the call reaches on GPUs of this host (the p2p and shm transports;
// no network transport carries GPU buffers yet; checkReach), and the caller's stream on the
// communicator's GPU (checkStream).
Status checkReach(const Call& c, Comm* comm) {
  const int me = comm->rank();
  const std::vector<PeerInfo>& peers = comm->peers();
  auto reach = [&](int p) -> Status {
    const PeerInfo& q = peers[static_cast<size_t>(p)];
    if (q.hostHash != peers[static_cast<size_t>(me)].hostHash) {
      return invalidUsage("GPU buffers, but rank " + std::to_string(p) +
                          " is on another host: GPU buffers between hosts need a network "
                          "transport for GPU memory, which this tutti build does not have yet "
                          "(use host buffers)");
    }
    if (q.cudaDev < 0) {
      return invalidUsage("GPU buffers, but rank " + std::to_string(p) +
                          " is a CPU rank (its communicator has no CUDA device)");
    }
    return Status::Ok();
  };
  if (c.kind == Kind::kSend || c.kind == Kind::kRecv)
    return c.root == me ? Status::Ok() : reach(c.root);
  // A collective reaches every rank: known since init (the loop below only finds the message).
  if (comm->peersOnLocalGpus() || peers.size() != static_cast<size_t>(comm->nranks()))
    return Status::Ok();
  for (int p = 0; p < comm->nranks(); ++p) {
    if (p != me) TUTTI_TRY(reach(p));
  }
  return Status::Ok();
}

Status checkStream(const Call& c, Comm* comm) {
  if (cuda::isDefaultStream(c.stream)) return Status::Ok();
  const int d = cuda::streamDevice(c.stream);
  if (d >= 0 && d != comm->cudaDev()) {
    return invalidArgument("the stream belongs to GPU " + std::to_string(d) +
                           " but the communicator is on GPU " + std::to_string(comm->cudaDev()));
  }
  return Status::Ok();
}

// comm is pinned by the caller.
Status validate(const Call& c, Comm* comm, RedOpSpec* red, bool* device, bool* pageLocked) {
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
    // Host buffers run on the CPU engine, GPU buffers as kernels; never one of each. Kernels
    // also take page-locked host memory they reach at its own address (mapped) next to GPU
    // memory; and a call on page-locked memory alone runs as kernels, in stream order as NCCL
    // runs it, where every rank it reaches is a GPU rank of this host (the kernel path's own
    // condition, the same on every rank: else the CPU engine, as for any host buffer).
    cuda::PointerKind sendKind = needSend ? cuda::pointerKind(c.send) : cuda::PointerKind{};
    cuda::PointerKind recvKind = !needRecv                      ? cuda::PointerKind{}
                                 : needSend && c.recv == c.send ? sendKind  // in place
                                                                : cuda::pointerKind(c.recv);
    *pageLocked = (needSend && sendKind.mapped) || (needRecv && recvKind.mapped);
    if (comm->cudaDev() >= 0) {
      const bool gpuMemory = sendKind.device || recvKind.device;
      const bool mappedOnly =
          !gpuMemory && (!needSend || sendKind.mapped) && (!needRecv || recvKind.mapped);
      if (gpuMemory || (mappedOnly && checkReach(c, comm).ok())) {
        sendKind.device |= sendKind.mapped;
        recvKind.device |= recvKind.mapped;
      }
    }
    if (needSend && needRecv && sendKind.device != recvKind.device) {
      return invalidArgument(std::string(sendKind.device ? "sendbuff" : "recvbuff") +
                             " is GPU memory but " + (sendKind.device ? "recvbuff" : "sendbuff") +
                             " is pageable host memory: both must be of one kind");
    }
    *device = sendKind.device || recvKind.device;
    if (*device && comm->cudaDev() < 0) {
      return invalidUsage("GPU buffers on rank " + std::to_string(comm->rank()) +
                          ", a CPU rank (its communicator has no CUDA device)");
    }
    for (auto [p, kind] : {std::pair{c.send, sendKind}, std::pair{c.recv, recvKind}}) {
      if (kind.gpu >= 0 && kind.gpu != comm->cudaDev()) {
        return invalidArgument("buffer " + std::to_string(reinterpret_cast<uintptr_t>(p)) +
                               " is memory of GPU " + std::to_string(kind.gpu) + " but rank " +
                               std::to_string(comm->rank()) + "'s communicator is on GPU " +
                               std::to_string(comm->cudaDev()));
      }
    }
  }
  if (*device) {
    TUTTI_TRY(checkReach(c, comm));
    TUTTI_TRY(checkStream(c, comm));
  }
  if (c.op != kNone) {
    TUTTI_ASSIGN(spec, comm->resolveOp(c.op, c.dtype));
    *red = spec;
    if (!*device && red->scalarPtr && comm->cudaDev() < 0 &&
        cuda::pointerKind(red->scalarPtr).device) {
      return invalidArgument(
          "the PreMulSum scalar is GPU memory, but this rank is a CPU rank (its communicator has "
          "no CUDA device): use host memory");
    }
    if (*device && red->scalarPtr) {  // ncclScalarDevice: the kernel reads it
      const cuda::PointerKind k = cuda::pointerKind(red->scalarPtr);
      if (!k.device && !k.mapped) {
        return invalidArgument(
            "the PreMulSum scalar is ncclScalarDevice but is memory the GPU cannot read "
            "(pageable host memory): use device memory or page-locked host memory");
      }
      if (k.gpu >= 0 && k.gpu != comm->cudaDev()) {
        return invalidArgument("the PreMulSum scalar is memory of GPU " + std::to_string(k.gpu) +
                               " but the communicator is on GPU " +
                               std::to_string(comm->cudaDev()));
      }
    }
  }
  if (*device && c.op != kNone && !(comm->nranks() == 1 && !red->pre) &&
      !dev::kernelFor(c.dtype, red->fn, 0)) {  // (one rank copies, without a kernel)
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

// Host buffers on a GPU rank run on the CPU engine when the group runs (group::submit waits
// for the caller's stream first), not when a graph is replayed: a stream being captured is
// refused (the legacy default stream never is).
Status refuseCapture(const Call& c, Comm* comm) {
  void* stream = static_cast<void*>(c.stream);
  if (cuda::isLegacyStream(stream)) return Status::Ok();
  unsigned long long capture = 0;
  TUTTI_TRY(cuda::captureIdOn(stream, comm->cudaDev(), &capture));
  if (!capture) return Status::Ok();
  return invalidUsage("rank " + std::to_string(comm->rank()) + " of " +
                      std::to_string(comm->nranks()) +
                      ": host buffers cannot be captured into a CUDA graph (the stream is "
                      "capturing): the CPU runs the operation when it is called, not when the "
                      "graph is replayed");
}

// One rank's collective on GPU buffers is its input: a copy on the caller's stream, made at
// the call as NCCL makes it (ncclLaunchOneRank), or nothing in place -- no engine, plan or
// launch (1 rank, 8 B: tutti 7.01 us against NCCL's 6.04, 2026-11-23). A PreMulSum needs the
// kernel, and a group that holds this communicator's operations keeps the calls' order on one
// stream: both take the engine. (Across streams nothing orders them, in NCCL either.)
bool oneRankCopies(const Call& c, const Comm* comm, const RedOpSpec& red, bool device) {
  return device && comm->nranks() == 1 && !red.pre &&
         (c.kind == Kind::kAllReduce || c.kind == Kind::kAllGather ||
          c.kind == Kind::kReduceScatter || c.kind == Kind::kBroadcast ||
          c.kind == Kind::kReduce) &&
         !group::holds(comm);
}

Status oneRankCopy(const Call& c, Comm* comm) {
  TUTTI_TRY(comm->failedEarlier());
  TUTTI_INFO(log::kColl,
             "%s: sendbuff %p recvbuff %p count %zu datatype %d op %d root %d comm %p [nranks=1] "
             "one-rank copy",
             c.fn + 4, c.send, c.recv, c.count, c.dtype, c.op == kNone ? -1 : c.op,
             c.root == kNone ? -1 : c.root, static_cast<void*>(comm));
  if (c.send == c.recv) return Status::Ok();
  return cuda::copyAsync(const_cast<void*>(c.recv), c.send, c.count * api::typeSize(c.dtype),
                         static_cast<void*>(c.stream), comm->cudaDev());
}

// A refused call fails alone; inside a group it also fails the group (group::noteError).
ncclResult_t refuse(const char* fn, const Status& s) {
  group::noteError(Status(s.code(), std::string(fn) + ": " + s.message()));
  return fail(fn, s);
}

ncclResult_t enqueue(const Call& c) {
  Comm* comm = registry::pin(c.comm);
  if (!comm) {
    Result<Comm*> why = api::lookup(c.comm, api::Need::kAny);
    return refuse(c.fn,
                  why.ok() ? invalidArgument("comm was destroyed during the call") : why.status());
  }
  RedOpSpec red;
  bool device = false, pageLocked = false;
  if (Status s = validate(c, comm, &red, &device, &pageLocked); !s.ok()) {
    const std::string who =
        "rank " + std::to_string(comm->rank()) + " of " + std::to_string(comm->nranks()) + ": ";
    comm->unpin();
    return refuse(c.fn, Status(s.code(), who + s.message()));
  }
  if (c.count == 0) {  // nothing to move: no engine, no kernel (its buffers may be anything)
    comm->unpin();
    return ncclSuccess;
  }
  if (!device && comm->cudaDev() >= 0) {
    if (Status s = refuseCapture(c, comm); !s.ok()) {
      comm->unpin();
      return refuse(c.fn, s);
    }
  }
  if (oneRankCopies(c, comm, red, device)) {
    Status s = oneRankCopy(c, comm);
    comm->unpin();
    return s.ok() ? ncclSuccess : refuse(c.fn, s);
  }
  Status s;
  if (c.kind == Kind::kAlltoAll || c.kind == Kind::kGather || c.kind == Kind::kScatter) {
    std::vector<CollArgs> ops = expand(c, comm, red, device);
    for (CollArgs& op : ops) op.pageLocked = pageLocked && !device;
    s = group::submit(comm, ops.data(), ops.size());
  } else {  // the common case: one operation, no allocation
    CollArgs op = argsFor(c, c.kind, c.send, const_cast<void*>(c.recv), c.root, red, device);
    op.pageLocked = pageLocked && !device;
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
