/*
 * The DLPack ABI, as far as the variant pack uses it: the tensor structs (legacy and
 * versioned) and the C exchange table a producer publishes on its type as
 * `__dlpack_c_exchange_api__` (a PyCapsule named "dlpack_exchange_api").
 *
 * Written here from the public DLPack 1.x ABI so the extension needs no framework
 * headers. Only the layout matters: field order and widths must match the ABI exactly.
 */
#ifndef CUDNN_PYGRAPH_DLPACK_H
#define CUDNN_PYGRAPH_DLPACK_H

#include <stddef.h>
#include <stdint.h>

#define PG_DLPACK_MAJOR 1
#define PG_DLPACK_MINOR 1

/* Device types (DLDeviceType values; stored as int32). */
enum { PG_DL_CPU = 1, PG_DL_CUDA = 2, PG_DL_CUDA_HOST = 3, PG_DL_ROCM = 10,
       PG_DL_CUDA_MANAGED = 13 };

/* Type codes (DLDataTypeCode values; stored as uint8). */
enum {
    PG_DL_INT = 0, PG_DL_UINT = 1, PG_DL_FLOAT = 2, PG_DL_BFLOAT = 4, PG_DL_COMPLEX = 5,
    PG_DL_BOOL = 6, PG_DL_F8_E4M3 = 8, PG_DL_F8_E4M3FN = 10, PG_DL_F8_E5M2 = 12,
    PG_DL_F8_E8M0FNU = 14, PG_DL_F4_E2M1FN = 17
};

/* Flags of DLManagedTensorVersioned. */
#define PG_DL_FLAG_READ_ONLY (1ULL << 0)
#define PG_DL_FLAG_IS_COPIED (1ULL << 1)
#define PG_DL_FLAG_SUBBYTE_PADDED (1ULL << 2)

typedef struct { uint32_t major, minor; } PgDLVersion;
typedef struct { int32_t device_type; int32_t device_id; } PgDLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } PgDLDataType;

typedef struct {
    void *data;
    PgDLDevice device;
    int32_t ndim;
    PgDLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* elements; NULL means row-major compact (legacy producers) */
    uint64_t byte_offset;
} PgDLTensor;

typedef struct PgDLManagedTensor {
    PgDLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct PgDLManagedTensor *self);
} PgDLManagedTensor;

typedef struct PgDLManagedTensorVersioned {
    PgDLVersion version;
    void *manager_ctx;
    void (*deleter)(struct PgDLManagedTensorVersioned *self);
    uint64_t flags;
    PgDLTensor dl_tensor;
} PgDLManagedTensorVersioned;

/* The exchange table. Every entry takes/returns plain C; errors are Python exceptions set
 * by the callee (return -1), except the allocator, which reports through SetError. */
typedef struct PgDLExchangeHeader {
    PgDLVersion version;
    struct PgDLExchangeHeader *prev_api; /* an older-major table, or NULL */
} PgDLExchangeHeader;

typedef struct {
    PgDLExchangeHeader header;
    int (*managed_tensor_allocator)(PgDLTensor *prototype, PgDLManagedTensorVersioned **out,
                                    void *error_ctx,
                                    void (*set_error)(void *, const char *, const char *));
    int (*managed_tensor_from_py_object_no_sync)(void *py_object,
                                                 PgDLManagedTensorVersioned **out);
    int (*managed_tensor_to_py_object_no_sync)(PgDLManagedTensorVersioned *tensor,
                                               void **out_py_object);
    /* May be NULL. Fills a caller-owned DLTensor whose shape/strides stay the producer's
     * and are valid only until control returns to the producer: copy them at once. */
    int (*dltensor_from_py_object_no_sync)(void *py_object, PgDLTensor *out);
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_stream);
} PgDLExchangeAPI;

#define PG_DL_EXCHANGE_ATTR "__dlpack_c_exchange_api__"
#define PG_DL_EXCHANGE_CAPSULE "dlpack_exchange_api"

#endif
