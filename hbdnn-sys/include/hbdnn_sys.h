/*
 * hbdnn_sys.h - declarations of the hbDNN / hbUCP C API subset that bpu_vlm calls,
 * written for this project from the documented S100 signatures, struct layouts and
 * enum values (restated in docs/package-contract.md §9).
 * It is not derived from the vendor headers; constant names for status codes are
 * this project's spelling, their values are the documented ones.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef BPU_VLM_HBDNN_SYS_H
#define BPU_VLM_HBDNN_SYS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- handles (all opaque pointers on S100) ---- */
typedef void *hbDNNPackedHandle_t;
typedef void *hbDNNHandle_t;
typedef void *hbUCPTaskHandle_t;

/* ---- sizes ---- */
#define HB_DNN_TENSOR_MAX_DIMENSIONS 10

/* ---- hbDNNDataType (S100 numbering; differs from X3/X5) ---- */
#define HB_DNN_TENSOR_TYPE_S4 0
#define HB_DNN_TENSOR_TYPE_U4 1
#define HB_DNN_TENSOR_TYPE_S8 2
#define HB_DNN_TENSOR_TYPE_U8 3
#define HB_DNN_TENSOR_TYPE_F16 4
#define HB_DNN_TENSOR_TYPE_S16 5
#define HB_DNN_TENSOR_TYPE_U16 6
#define HB_DNN_TENSOR_TYPE_F32 7
#define HB_DNN_TENSOR_TYPE_S32 8
#define HB_DNN_TENSOR_TYPE_U32 9
#define HB_DNN_TENSOR_TYPE_F64 10
#define HB_DNN_TENSOR_TYPE_S64 11
#define HB_DNN_TENSOR_TYPE_U64 12
#define HB_DNN_TENSOR_TYPE_BOOL8 13
#define HB_DNN_TENSOR_TYPE_MAX 14

/* ---- hbDNNQuantiType ---- */
#define HB_DNN_QUANTI_TYPE_NONE 0
#define HB_DNN_QUANTI_TYPE_SCALE 1

/* ---- hbDNNDescType ---- */
#define HB_DNN_DESC_TYPE_UNKNOWN 0
#define HB_DNN_DESC_TYPE_STRING 1

/* ---- hbUCPSysMemFlushFlag ---- */
#define HB_SYS_MEM_CACHE_INVALIDATE 1
#define HB_SYS_MEM_CACHE_CLEAN 2

/* ---- scheduling ---- */
#define HB_UCP_PRIORITY_LOWEST 0
#define HB_UCP_PRIORITY_HIGHEST 255
#define HB_UCP_CORE_ANY 0ULL
#define HB_UCP_BPU_CORE_0 (1ULL << 0)
#define HB_UCP_BPU_CORE_1 (1ULL << 1)
#define HB_UCP_BPU_CORE_2 (1ULL << 2)
#define HB_UCP_BPU_CORE_3 (1ULL << 3)
#define HB_UCP_BPU_CORE_ANY (1ULL << 7)
#define HB_UCP_DSP_CORE_0 (1ULL << 8)
#define HB_UCP_DSP_CORE_1 (1ULL << 9)
#define HB_UCP_DSP_CORE_ANY (1ULL << 15)

/* ---- status codes (hbUCPStatus; hbDNNStatus aliases them on S100) ---- */
#define HB_UCP_SUCCESS 0
#define HB_UCP_INVALID_ARGUMENT (-100001)
#define HB_UCP_API_USE_ERROR (-100002)
#define HB_UCP_INIT_FAILED (-100003)
#define HB_UCP_UNKNOWN (-100004)
#define HB_UCP_TASK_NUMBER_EXCEED_LIMIT (-200001)
#define HB_UCP_TASK_TIMEOUT (-200002)
#define HB_UCP_TASK_RUN_FAILED (-200003)
#define HB_UCP_TASK_HANDLE_INVALID (-200004)
#define HB_UCP_MEM_ALLOC_FAIL (-400001)
#define HB_UCP_MEM_FREE_FAIL (-400002)
#define HB_UCP_MEM_FLUSH_FAIL (-400003)
#define HB_UCP_MEM_INVALIDATE_FAIL (-400004)
#define HB_UCP_MEM_IS_INVALID (-400005)
#define HB_UCP_MEM_MAP_FAIL (-400006)
#define HB_UCP_MEM_UNMAP_FAIL (-400007)
#define HB_UCP_FILE_OPEN_FAILED (-500001)
#define HB_UCP_MODEL_NUMBER_EXCEED (-600001)
#define HB_UCP_MODEL_INVALID (-600002)
#define HB_UCP_MODEL_IS_INUSE (-600003)
#define HB_UCP_MODEL_INCOMPATIBLE (-600004)

/* ---- structs (LP64 offsets in comments) ---- */
typedef struct hbUCPSysMem {
  uint64_t phyAddr; /* 0 */
  void *virAddr;    /* 8 */
  uint64_t memSize; /* 16 */
} hbUCPSysMem;      /* 24 */

typedef struct hbDNNTensorShape {
  int32_t dimensionSize[HB_DNN_TENSOR_MAX_DIMENSIONS]; /* 0 */
  int32_t numDimensions;                               /* 40 */
} hbDNNTensorShape;                                    /* 44 */

typedef struct hbDNNQuantiScale {
  int32_t scaleLen;       /* 0 */
  float *scaleData;       /* 8 */
  int32_t zeroPointLen;   /* 16 */
  int32_t *zeroPointData; /* 24 */
} hbDNNQuantiScale;       /* 32 */

typedef struct hbDNNTensorProperties {
  hbDNNTensorShape validShape;                   /* 0 */
  int32_t tensorType;                            /* 44 */
  hbDNNQuantiScale scale;                        /* 48 */
  int32_t quantiType;                            /* 80: a 4-byte enum in C */
  int32_t quantizeAxis;                          /* 84 */
  int64_t alignedByteSize;                       /* 88 */
  int64_t stride[HB_DNN_TENSOR_MAX_DIMENSIONS];  /* 96 */
} hbDNNTensorProperties;                         /* 176 */

typedef struct hbDNNTensor {
  hbUCPSysMem sysMem;               /* 0 */
  hbDNNTensorProperties properties; /* 24 */
} hbDNNTensor;                      /* 200 */

typedef struct hbUCPSchedParam {
  int32_t priority; /* 0 */
  int64_t customId; /* 8 */
  uint64_t backend; /* 16 */
  uint32_t deviceId; /* 24 */
} hbUCPSchedParam;  /* 32 */

typedef void (*hbUCPTaskDoneCb)(hbUCPTaskHandle_t task, int32_t status, void *userdata);

/*
 * The one function table: every entry point bpu_vlm calls. Filled from the board
 * libraries (libdnn.so: hbDNN*, libhbucp.so: hbUCP*) or from the simulator.
 * Field names are the C symbol names.
 */
typedef struct hbdnn_sys_fn_table {
  /* libdnn.so */
  char const *(*hbDNNGetVersion)(void);
  int32_t (*hbDNNInitializeFromFiles)(hbDNNPackedHandle_t *packed, char const **files, int32_t count);
  int32_t (*hbDNNRelease)(hbDNNPackedHandle_t packed);
  int32_t (*hbDNNGetModelNameList)(char const ***names, int32_t *count, hbDNNPackedHandle_t packed);
  int32_t (*hbDNNGetModelHandle)(hbDNNHandle_t *handle, hbDNNPackedHandle_t packed, char const *name);
  int32_t (*hbDNNGetInputCount)(int32_t *count, hbDNNHandle_t handle);
  int32_t (*hbDNNGetOutputCount)(int32_t *count, hbDNNHandle_t handle);
  int32_t (*hbDNNGetInputName)(char const **name, hbDNNHandle_t handle, int32_t index);
  int32_t (*hbDNNGetOutputName)(char const **name, hbDNNHandle_t handle, int32_t index);
  int32_t (*hbDNNGetInputTensorProperties)(hbDNNTensorProperties *properties, hbDNNHandle_t handle, int32_t index);
  int32_t (*hbDNNGetOutputTensorProperties)(hbDNNTensorProperties *properties, hbDNNHandle_t handle, int32_t index);
  int32_t (*hbDNNGetCompileBpuCoreNum)(int32_t *cores, hbDNNHandle_t handle);
  int32_t (*hbDNNInferV2)(hbUCPTaskHandle_t *task, hbDNNTensor *output, hbDNNTensor const *input, hbDNNHandle_t handle);
  char const *(*hbDNNGetErrorDesc)(int32_t status);
  /* libhbucp.so */
  char const *(*hbUCPGetVersion)(void);
  char const *(*hbUCPGetSocName)(void);
  int32_t (*hbUCPSubmitTask)(hbUCPTaskHandle_t task, hbUCPSchedParam *sched);
  int32_t (*hbUCPWaitTaskDone)(hbUCPTaskHandle_t task, int32_t timeout_ms);
  int32_t (*hbUCPReleaseTask)(hbUCPTaskHandle_t task);
  int32_t (*hbUCPMallocCached)(hbUCPSysMem *mem, uint64_t size, int32_t deviceId);
  int32_t (*hbUCPMemFlush)(hbUCPSysMem const *mem, int32_t flag);
  int32_t (*hbUCPFree)(hbUCPSysMem *mem);
  char const *(*hbUCPGetErrorDesc)(int32_t status);
} hbdnn_sys_fn_table;

#ifdef __cplusplus
}
#endif

#endif /* BPU_VLM_HBDNN_SYS_H */
