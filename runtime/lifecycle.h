// Creating and ending communicators: unique ids, init (blocking, nonblocking, inside a
// group), split, destroy and abort. The C API in bindings/c is a thin layer over these.
#pragma once

#include <string>

#include "runtime/comm.h"
#include "runtime/wire.h"

namespace tutti {

// A unique id with a fresh secret and a root started in this process; with NCCL_COMM_ID
// set, the id names that address instead and rank 0 starts the root at init.
Result<wire::UniqueId> newUniqueId();
// An id for a fixed rendezvous address, as NCCL_COMM_ID and the launchers use: every rank
// computes the same id on its own. The secret comes from TUTTI_SECRET when set, else from
// `jobKey` (the address plus whatever identifies the job).
Result<wire::UniqueId> idForAddress(const std::string& hostPort, const std::string& jobKey,
                                    bool spansHosts = false);

struct Started {
  Comm* comm;
  bool inProgress;                  // nonblocking, outside a group: poll ncclCommGetAsyncError
  std::shared_future<Status> done;  // valid when the work runs in the background
};

// cudaDev -1: a CPU communicator.
Result<Started> initRank(int nranks, const wire::UniqueId& id, int rank, int cudaDev,
                         CommConfig config);
// Collective over `parent`; *comm null for NCCL_SPLIT_NOCOLOR.
Result<Started> splitComm(Comm* parent, int color, int key, CommConfig config);
// Frees the communicator; `abort` first makes every wait of it return.
void destroyComm(Comm* comm, bool abort);

}  // namespace tutti
