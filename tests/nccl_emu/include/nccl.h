/* Stand-in for <nccl.h>, for fs/group_nccl.c in the test build only: the
 * types and values the NCCL lane uses, with NCCL's own numbering of the
 * results.  The functions come from fake_nccl.c through dlopen, as from
 * the real libnccl. */
#ifndef RS_EMU_NCCL_H
#define RS_EMU_NCCL_H

#include "cuda_runtime_api.h"

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
} ncclResult_t;

typedef struct ncclComm *ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
	char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum { ncclInt8 = 0, ncclUint8 = 1 } ncclDataType_t;

typedef struct {
	int blocking;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER { 1 }

#endif
