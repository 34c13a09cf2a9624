/*
 * tutti.h -- tutti's extensions to the NCCL API. Include after (or instead of) nccl.h.
 */
#ifndef TUTTI_TUTTI_H_
#define TUTTI_TUTTI_H_

#include "nccl.h"

#define TUTTI_VERSION_MAJOR 0
#define TUTTI_VERSION_MINOR 1
#define TUTTI_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Builds a communicator from the environment a launcher leaves behind, in this order:
 *   rank / size: RANK + WORLD_SIZE (torchrun, tutti-run), OMPI_COMM_WORLD_RANK +
 *                OMPI_COMM_WORLD_SIZE (Open MPI), PMI_RANK + PMI_SIZE, SLURM_PROCID +
 *                SLURM_NTASKS (srun);
 *   rendezvous:  NCCL_COMM_ID=host:port, else MASTER_ADDR + (TUTTI_PORT or MASTER_PORT+1),
 *                else under Slurm the first host of SLURM_STEP_NODELIST and a port derived
 *                from the job id, else under Open MPI with every rank on one host
 *                (OMPI_COMM_WORLD_LOCAL_SIZE = OMPI_COMM_WORLD_SIZE) 127.0.0.1 and a port
 *                derived from OMPI_MCA_ess_base_jobid or PMIX_NAMESPACE (TUTTI_PORT
 *                overrides either port);
 *   device:      with CUDA devices present, LOCAL_RANK / OMPI_COMM_WORLD_LOCAL_RANK /
 *                SLURM_LOCALID modulo the device count; otherwise a CPU communicator.
 * Rank 0 hosts the rendezvous. Where the launcher says the ranks are on several hosts
 * (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS below the size; Slurm's
 * SLURM_STEP_NUM_NODES above 1) and the rendezvous host is a loopback address on rank 0's
 * host (its own name, which Debian and Ubuntu map to 127.0.1.1), rank 0 listens on every
 * address and the ranks on their interface (NCCL_SOCKET_IFNAME), so the other hosts reach
 * them by the address that name has there. The handshake secret is derived from TUTTI_SECRET
 * when set (tutti-run sets a random one), else from the job's identity, so ranks of another job
 * are refused. Returns ncclInvalidUsage, with ncclGetLastError saying what is missing, when the
 * environment does not describe a job.
 */
ncclResult_t tuttiCommInitFromEnv(ncclComm_t* comm);

/* tutti's own version as MAJOR*10000 + MINOR*100 + PATCH (ncclGetVersion reports the NCCL API
 * level that tutti implements). */
ncclResult_t tuttiGetVersion(int* version);

#ifdef __cplusplus
}
#endif

#endif /* TUTTI_TUTTI_H_ */
