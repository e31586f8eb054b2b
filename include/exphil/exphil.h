/*
 * ExPhil.Native C ABI: fused GPU recurrences and attention on caller-owned
 * device memory.
 *
 * Every function here is safe to call from any thread, never exits, aborts or
 * throws, and reports failure through its return value. The message of the
 * most recent failed call on the calling thread is exphil_last_error().
 *
 * ---------------------------------------------------------------------------
 * Conventions shared by every op
 * ---------------------------------------------------------------------------
 * Tensors. An exphil_tensor describes memory the caller owns: a device
 * address, a dtype, a rank and a shape, densely packed in row-major order
 * (XLA's default layout, and what Nx.to_pointer/2 hands out). The library
 * never allocates, frees or keeps a caller's tensor beyond the call.
 *
 * Shapes. Sequence tensors are [B, T, H] (batch, time, width); state tensors
 * are [B, H]. Every dimension must be >= 1; there are no other limits on B, T
 * or H (odd widths and T = 1 are fine).
 *
 * Dtypes. All sequence tensors of one call (inputs, y, grad_y and the input
 * gradients) share one dtype: f32, f16 or bf16. Each state tensor (h0,
 * h_final, grad_h_final, grad_h0) is either f32 or that same dtype, chosen
 * per tensor by its descriptor. The recurrence state and all arithmetic are
 * f32 inside the kernels, whatever the dtypes.
 *
 * Optional arguments. Arguments documented "may be NULL" are either a NULL
 * descriptor pointer or absent; every other descriptor and its data pointer
 * must be non-NULL. An absent h0 means a zero initial state; an absent
 * grad_h_final means no gradient flows into the final state; an absent
 * h_final or grad_h0 output is simply not written.
 *
 * Memory. All tensors of one call must live on the same CUDA device (device
 * or managed memory) and lie wholly inside their allocations. Outputs must
 * not overlap each other or any input; inputs may alias each other. Data
 * pointers must be aligned to their element size; for the scans, 16-byte
 * alignment and H divisible by 4 select the vectorised kernels, anything
 * else a scalar path with the same results (attention needs 16 bytes).
 *
 * Streams. `stream` NULL means the library's own non-blocking stream for the
 * tensors' device (created on first use, see exphil_synchronize). Otherwise
 * the work is enqueued on the caller's cudaStream_t (exphil_stream is the
 * same type), which must belong to the tensors' device. Every op is
 * asynchronous: it returns once the work is enqueued. The kernels do not wait
 * for work on other streams: if the inputs are produced on another stream,
 * order the two streams first (an event, or exphil_synchronize and
 * cudaStreamSynchronize). Ops may take temporary device memory, ordered on
 * the stream, from a memory pool of the library's own (cudaMallocAsync).
 *
 * Graphs. Every op may be captured into a CUDA graph (any capture mode),
 * and the graph may be nested in another as a child graph, as XLA's command
 * buffers do. A captured op that needs temporary memory takes a block that
 * the graph then owns (a CUDA user object): it returns to the library for
 * reuse once every copy of the graph (clones, child-graph nodes, executable
 * graphs) is destroyed and their launches have finished. The executable
 * graphs instantiated from one capture share its blocks, so do not launch
 * two of them at the same time.
 *
 * Determinism. Forward and backward results are bitwise identical from run
 * to run for the same shapes, dtypes, alignment and device model.
 *
 * Backward. The backward of an op takes the forward's inputs, the forward's
 * output y, and the gradient of the loss with respect to y (grad_y) and, if
 * any, to the final state (grad_h_final). It writes the gradient of every
 * sequence input and, if asked, of h0. y must be the output of the forward
 * call on the same inputs and h0: the backward rebuilds the f32 states from
 * it rather than storing them.
 */
#ifndef EXPHIL_EXPHIL_H
#define EXPHIL_EXPHIL_H

#include <stddef.h>
#include <stdint.h>

#include "exphil/version.h"

#if defined(__GNUC__)
#define EXPHIL_API __attribute__((visibility("default")))
#else
#define EXPHIL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. EXPHIL_OK is 0; every failure is positive. */
typedef enum exphil_status {
  EXPHIL_OK = 0,
  EXPHIL_ERROR_INVALID_ARGUMENT = 1, /* a descriptor, shape, dtype, pointer or option is wrong */
  EXPHIL_ERROR_NO_DEVICE = 2,        /* no CUDA device or no usable driver on this machine */
  EXPHIL_ERROR_OUT_OF_MEMORY = 3,    /* a device allocation failed */
  EXPHIL_ERROR_CUDA = 4,             /* any other CUDA failure; the message names the call */
  EXPHIL_ERROR_NOT_SUPPORTED = 5,    /* valid input the kernels cannot run (a size limit) */
  EXPHIL_ERROR_INTERNAL = 6          /* a bug in the library; the message says where */
} exphil_status;

typedef enum exphil_dtype {
  EXPHIL_F32 = 0,
  EXPHIL_F16 = 1,
  EXPHIL_BF16 = 2
} exphil_dtype;

#define EXPHIL_MAX_RANK 8

/* A dense row-major tensor in device memory. `data` is the address of the
 * first element; `dtype` is an exphil_dtype value; shape[0..rank-1] are the
 * dimensions, outermost first (entries past `rank` are ignored). */
typedef struct exphil_tensor {
  void* data;
  int32_t dtype;
  int32_t rank;
  int64_t shape[EXPHIL_MAX_RANK];
} exphil_tensor;

/* The same type as cudaStream_t, declared here so that callers need no CUDA
 * headers. */
struct CUstream_st;
typedef struct CUstream_st* exphil_stream;

/* ---------------------------------------------------------------------------
 * Library and devices
 * ------------------------------------------------------------------------- */

/* The library's version, "MAJOR.MINOR.PATCH" (EXPHIL_VERSION_STRING of the
 * build). Static storage; never NULL. */
EXPHIL_API const char* exphil_version(void);

/* The message of the most recent call on this thread that did not return
 * EXPHIL_OK ("" if none has failed). Thread-local storage, valid until the
 * next failing call on this thread; never NULL. */
EXPHIL_API const char* exphil_last_error(void);

/* A constant name for a status code, e.g. "EXPHIL_ERROR_NO_DEVICE". */
EXPHIL_API const char* exphil_status_name(int status);

/* Writes the number of CUDA devices to *count: 0, with EXPHIL_OK, on a
 * machine with no GPU or no driver. count must not be NULL. */
EXPHIL_API exphil_status exphil_device_count(int* count);

/* Blocks until all work enqueued on the library's own stream for `device`
 * has finished. Succeeds at once if that stream was never created. Returns
 * EXPHIL_ERROR_INVALID_ARGUMENT for a device index out of range and the
 * error of any failed kernel found on the stream. */
EXPHIL_API exphil_status exphil_synchronize(int device);

/* Device memory owned by the library, for callers with no allocator of their
 * own (an FFI that wants somewhere to put tensors): cudaMalloc on `device`,
 * so 256-byte aligned; *ptr receives the address (NULL on failure). bytes
 * must be > 0; ptr must not be NULL. */
EXPHIL_API exphil_status exphil_device_alloc(int device, size_t bytes, void** ptr);

/* Frees memory from exphil_device_alloc; NULL is a no-op. Any other address
 * (an interior pointer, host memory) is EXPHIL_ERROR_INVALID_ARGUMENT. Like
 * cudaFree, it first waits for the work on the owning device. */
EXPHIL_API exphil_status exphil_device_free(void* ptr);

/* ---------------------------------------------------------------------------
 * linear_scan: h_t = a_t * h_{t-1} + b_t
 *
 * forward:  a, b [B, T, H]; h0 [B, H] (may be NULL);
 *           writes y [B, T, H] (every h_t) and h_final [B, H] (h_{T-1}; may
 *           be NULL).
 * backward: a, b (may be NULL), h0 (may be NULL), y as in the forward;
 *           grad_y [B, T, H]; grad_h_final [B, H] (may be NULL);
 *           writes grad_a, grad_b [B, T, H] and grad_h0 [B, H] (may be NULL).
 *           The gradients do not depend on b: with b NULL each state h_{t-1}
 *           is read from y (h0 at t = 0) rather than rebuilt from (a, b), one
 *           more read of y per step.
 * ------------------------------------------------------------------------- */
EXPHIL_API exphil_status exphil_linear_scan_forward(
    const exphil_tensor* a, const exphil_tensor* b, const exphil_tensor* h0,
    const exphil_tensor* y, const exphil_tensor* h_final, exphil_stream stream);

EXPHIL_API exphil_status exphil_linear_scan_backward(
    const exphil_tensor* a, const exphil_tensor* b, const exphil_tensor* h0,
    const exphil_tensor* y, const exphil_tensor* grad_y,
    const exphil_tensor* grad_h_final, const exphil_tensor* grad_a,
    const exphil_tensor* grad_b, const exphil_tensor* grad_h0,
    exphil_stream stream);

/* ---------------------------------------------------------------------------
 * min_gru: z_t = sigmoid(gate_t); h_t = (1 - z_t) * h_{t-1} + z_t * candidate_t
 * (the candidate is used as given, with no activation)
 *
 * forward:  gate, candidate [B, T, H]; h0 [B, H] (may be NULL);
 *           writes y [B, T, H] and h_final [B, H] (may be NULL).
 * backward: gate, candidate, h0 (may be NULL), y; grad_y [B, T, H];
 *           grad_h_final [B, H] (may be NULL);
 *           writes grad_gate, grad_candidate [B, T, H] and grad_h0 [B, H]
 *           (may be NULL).
 * ------------------------------------------------------------------------- */
EXPHIL_API exphil_status exphil_min_gru_forward(
    const exphil_tensor* gate, const exphil_tensor* candidate,
    const exphil_tensor* h0, const exphil_tensor* y,
    const exphil_tensor* h_final, exphil_stream stream);

EXPHIL_API exphil_status exphil_min_gru_backward(
    const exphil_tensor* gate, const exphil_tensor* candidate,
    const exphil_tensor* h0, const exphil_tensor* y,
    const exphil_tensor* grad_y, const exphil_tensor* grad_h_final,
    const exphil_tensor* grad_gate, const exphil_tensor* grad_candidate,
    const exphil_tensor* grad_h0, exphil_stream stream);

/* ---------------------------------------------------------------------------
 * min_lstm: f_t = sigmoid(forget_t), i_t = sigmoid(input_t),
 *           s_t = f_t + i_t + 1e-6,
 *           h_t = (f_t / s_t) * h_{t-1} + (i_t / s_t) * candidate_t
 *
 * forward:  forget, input, candidate [B, T, H]; h0 [B, H] (may be NULL);
 *           writes y [B, T, H] and h_final [B, H] (may be NULL).
 * backward: forget, input, candidate, h0 (may be NULL), y; grad_y [B, T, H];
 *           grad_h_final [B, H] (may be NULL);
 *           writes grad_forget, grad_input, grad_candidate [B, T, H] and
 *           grad_h0 [B, H] (may be NULL).
 * ------------------------------------------------------------------------- */
EXPHIL_API exphil_status exphil_min_lstm_forward(
    const exphil_tensor* forget, const exphil_tensor* input,
    const exphil_tensor* candidate, const exphil_tensor* h0,
    const exphil_tensor* y, const exphil_tensor* h_final, exphil_stream stream);

EXPHIL_API exphil_status exphil_min_lstm_backward(
    const exphil_tensor* forget, const exphil_tensor* input,
    const exphil_tensor* candidate, const exphil_tensor* h0,
    const exphil_tensor* y, const exphil_tensor* grad_y,
    const exphil_tensor* grad_h_final, const exphil_tensor* grad_forget,
    const exphil_tensor* grad_input, const exphil_tensor* grad_candidate,
    const exphil_tensor* grad_h0, exphil_stream stream);

/* ---------------------------------------------------------------------------
 * liquid (exact step of a liquid time-constant cell):
 *           h_t = target_t + (h_{t-1} - target_t) * exp(-1 / tau_t)
 *
 * tau must be > 0; the kernels do not check values, and tau <= 0 yields what
 * the formula yields in f32 (inf or NaN).
 * forward:  tau, target [B, T, H]; h0 [B, H] (may be NULL);
 *           writes y [B, T, H] and h_final [B, H] (may be NULL).
 * backward: tau, target, h0 (may be NULL), y; grad_y [B, T, H];
 *           grad_h_final [B, H] (may be NULL);
 *           writes grad_tau, grad_target [B, T, H] and grad_h0 [B, H] (may
 *           be NULL).
 * ------------------------------------------------------------------------- */
EXPHIL_API exphil_status exphil_liquid_forward(
    const exphil_tensor* tau, const exphil_tensor* target,
    const exphil_tensor* h0, const exphil_tensor* y,
    const exphil_tensor* h_final, exphil_stream stream);

EXPHIL_API exphil_status exphil_liquid_backward(
    const exphil_tensor* tau, const exphil_tensor* target,
    const exphil_tensor* h0, const exphil_tensor* y,
    const exphil_tensor* grad_y, const exphil_tensor* grad_h_final,
    const exphil_tensor* grad_tau, const exphil_tensor* grad_target,
    const exphil_tensor* grad_h0, exphil_stream stream);


/* ---------------------------------------------------------------------------
 * selective_scan (Mamba's S6 scan). Sequences are [B, T, D] (batch, time,
 * channels), the state of each channel has N entries.
 *
 *   u_t     = dt_t + dt_bias                 (dt_bias optional)
 *   u_t     = softplus(u_t)                  (if options->softplus)
 *   delta_t = clamp(u_t, dt_min, dt_max)     (if options->clamp; applied last)
 *   h_t[d, n] = exp(delta_t[d] * A[d, n]) * h_{t-1}[d, n]
 *               + delta_t[d] * B_t[n] * x_t[d]
 *   y_t[d]  = sum_n C_t[n] * h_t[d, n] + D[d] * x_t[d]      (D optional)
 *   y_t[d] *= silu(z_t[d])                                 (z optional)
 *
 * Tensors: x, dt, z, y [B, T, D]; B, C [B, T, N]; A [D, N]; dt_bias, D [D];
 * h0, h_final [B, D, N]. x, dt, B, C, z, y, grad_y and the gradients of
 * x, dt, B, C and z share one dtype (f32, f16 or bf16); A, dt_bias, D, h0,
 * h_final, grad_h_final and the gradients of A, dt_bias, D and h0 are f32.
 * N is 1 to 256; B, T, D are any size >= 1.
 *
 * options may be NULL: no softplus, no clamp. With clamp, dt_min and dt_max
 * must be finite and dt_min <= dt_max. The clamp's gradient is zero where it
 * is active (u < dt_min or u > dt_max) and passes elsewhere.
 *
 * forward:  writes y and h_final (may be NULL).
 * backward: takes the forward's inputs and options, grad_y and grad_h_final
 *           (may be NULL: no gradient into the final state). Every gradient
 *           output may be NULL (not written); a gradient of an absent input
 *           must be NULL. The backward recomputes the states from the inputs,
 *           from fp32 checkpoints: one state per 16 steps in on-chip shared
 *           memory, and, for sequences longer than that holds (256 steps at
 *           N <= 16, 64 at N = 64, ...), one state per chunk in temporary
 *           device memory, so memory never grows with T * N at the
 *           granularity of steps. Sums over batch, time and channels
 *           (grad_A, grad_dt_bias, grad_D, grad_B, grad_C) are taken in a
 *           fixed order: bitwise deterministic. Temporary device memory
 *           (from the stream-ordered pool) also holds per-block parts of
 *           grad_B and grad_C: 2 * B * T * ceil(D / 32) * N floats.
 * ------------------------------------------------------------------------- */
typedef struct exphil_selective_scan_options {
  int32_t softplus; /* nonzero: apply softplus after the bias */
  int32_t clamp;    /* nonzero: clamp to [dt_min, dt_max] last */
  float dt_min;
  float dt_max;
} exphil_selective_scan_options;

EXPHIL_API exphil_status exphil_selective_scan_forward(
    const exphil_tensor* x, const exphil_tensor* dt, const exphil_tensor* A,
    const exphil_tensor* B, const exphil_tensor* C, const exphil_tensor* dt_bias,
    const exphil_tensor* D, const exphil_tensor* z, const exphil_tensor* h0,
    const exphil_selective_scan_options* options, const exphil_tensor* y,
    const exphil_tensor* h_final, exphil_stream stream);

EXPHIL_API exphil_status exphil_selective_scan_backward(
    const exphil_tensor* x, const exphil_tensor* dt, const exphil_tensor* A,
    const exphil_tensor* B, const exphil_tensor* C, const exphil_tensor* dt_bias,
    const exphil_tensor* D, const exphil_tensor* z, const exphil_tensor* h0,
    const exphil_selective_scan_options* options, const exphil_tensor* grad_y,
    const exphil_tensor* grad_h_final, const exphil_tensor* grad_x,
    const exphil_tensor* grad_dt, const exphil_tensor* grad_A,
    const exphil_tensor* grad_B, const exphil_tensor* grad_C,
    const exphil_tensor* grad_dt_bias, const exphil_tensor* grad_D,
    const exphil_tensor* grad_z, const exphil_tensor* grad_h0,
    exphil_stream stream);

/* ---------------------------------------------------------------------------
 * attention (scaled dot-product attention with grouped-query heads).
 *
 *   O[b, h] = softmax(scale * Q[b, h] K[b, g]^T + mask) V[b, g],
 *   g = h / (Hq / Hkv)
 *   lse[b, h, i] = log sum_j exp(scale * Q[b, h, i] . K[b, g, j] + mask[i, j])
 *
 * Tensors, with layout EXPHIL_ATTENTION_BHTD (the default):
 *   q, o, grad_o, grad_q [B, Hq, T, d];  k, v, grad_k, grad_v [B, Hkv, S, d];
 * with layout EXPHIL_ATTENTION_BTHD the same tensors are [B, T, Hq, d] and
 * [B, S, Hkv, d]. lse is [B, Hq, T] in f32 with either layout. q, k, v, o,
 * grad_o and the three gradients share one dtype: f32, f16 or bf16. Hq must
 * be a multiple of Hkv. The head width d is 32, 64, 96 or 128 (any other
 * returns EXPHIL_ERROR_NOT_SUPPORTED); B and Hq are 1 to 65535; Hkv, T and S
 * any size >= 1. Unlike the scans, every tensor but lse must be 16-byte
 * aligned (the kernels move rows in 16-byte vectors; device allocations and
 * whole Nx tensors always are); lse needs 4 bytes.
 *
 * Masks (query i, key j; the causal diagonal is aligned to the bottom right,
 * so with T != S query i is the one at position i + S - T):
 *   EXPHIL_ATTENTION_MASK_NONE     every key;
 *   EXPHIL_ATTENTION_MASK_CAUSAL   j <= i + S - T;
 *   EXPHIL_ATTENTION_MASK_WINDOW   i + S - T - window < j <= i + S - T
 *                                  (the last `window` keys, window >= 1).
 * A query row that sees no key gets O = 0 and lse = -inf; its grad_q row is
 * written as zeros and it adds nothing to grad_k and grad_v. `window` is
 * read only with EXPHIL_ATTENTION_MASK_WINDOW.
 *
 * Arithmetic. Softmax and every sum are f32. f16 and bf16 inputs run on tensor
 * cores (mma.sync, sm_80 and later), with the probabilities and the
 * gradients of the scores rounded to the input dtype before their products,
 * as FlashAttention does. f32 inputs run in exact f32 FMAs (no TF32) unless
 * options->precision is EXPHIL_ATTENTION_TF32X3: then their products run on
 * tensor cores, each operand split into two TF32 values and each product
 * taken as three TF32 products (what PyTorch's memory-efficient attention
 * does for f32). That drops about 2^-21 of each product, against 2^-24 per
 * exact FMA: results near f32's, not bitwise those of the exact path, and
 * still bitwise deterministic. With f16 and bf16 only EXPHIL_ATTENTION_EXACT
 * is accepted.
 *
 * forward:  writes o and lse (lse may be NULL: not written).
 * backward: takes q, k, v, the forward's o and lse (both required: the
 *           outputs of a forward call with the same inputs and options),
 *           and grad_o; writes grad_q, grad_k and grad_v (each may be NULL:
 *           not written).
 *           grad_k and grad_v sum over the query heads that share each
 *           key/value head. No atomics: bitwise deterministic. Temporary
 *           device memory: B * Hq * T floats.
 * options may be NULL: no mask, layout BHTD, scale 1 / sqrt(d), exact
 * precision. Zero-initialised options mean the same.
 * ------------------------------------------------------------------------- */
typedef enum exphil_attention_mask {
  EXPHIL_ATTENTION_MASK_NONE = 0,
  EXPHIL_ATTENTION_MASK_CAUSAL = 1,
  EXPHIL_ATTENTION_MASK_WINDOW = 2
} exphil_attention_mask;

typedef enum exphil_attention_layout {
  EXPHIL_ATTENTION_BHTD = 0, /* [batch, heads, time, head width] */
  EXPHIL_ATTENTION_BTHD = 1  /* [batch, time, heads, head width] */
} exphil_attention_layout;

typedef enum exphil_attention_precision {
  EXPHIL_ATTENTION_EXACT = 0, /* f32 products in exact f32 FMAs */
  EXPHIL_ATTENTION_TF32X3 = 1 /* f32 only: three TF32 tensor-core products */
} exphil_attention_precision;

typedef struct exphil_attention_options {
  int32_t mask;   /* an exphil_attention_mask */
  int32_t window; /* with EXPHIL_ATTENTION_MASK_WINDOW: keys seen, >= 1 */
  int32_t layout; /* an exphil_attention_layout */
  float scale;    /* 0: 1 / sqrt(d); otherwise finite, used as given (so a
                     scale of exactly 0 cannot be asked for) */
  int32_t precision; /* an exphil_attention_precision (added in 0.2.0) */
} exphil_attention_options;

EXPHIL_API exphil_status exphil_attention_forward(
    const exphil_tensor* q, const exphil_tensor* k, const exphil_tensor* v,
    const exphil_attention_options* options, const exphil_tensor* o,
    const exphil_tensor* lse, exphil_stream stream);

EXPHIL_API exphil_status exphil_attention_backward(
    const exphil_tensor* q, const exphil_tensor* k, const exphil_tensor* v,
    const exphil_tensor* o, const exphil_tensor* lse,
    const exphil_tensor* grad_o, const exphil_attention_options* options,
    const exphil_tensor* grad_q, const exphil_tensor* grad_k,
    const exphil_tensor* grad_v, exphil_stream stream);

/* ---------------------------------------------------------------------------
 * gru and lstm: GRU and LSTM sequences with the recurrent product fused in
 * (added in 0.2.0; exphil/gated_rnn.hpp gives the math, gate orders and
 * bias conventions). The caller computes the input projection wx = x W + b
 * of every step; G = 3 (GRU: gates r, z, n) or 4 (LSTM: i, f, g, o) side by
 * side in the last dimension.
 *
 *   wx, grad_wx, grad_rh [B, T, G*H];  R, grad_R [H, G*H];  bias, grad_bias
 *   [G*H];  h0, c0, h_final, c_final and their gradients [B, H];
 *   y, grad_y [B, T, H]
 *
 * wx, y, grad_y, grad_wx and grad_rh share one dtype (f32, f16 or bf16); R,
 * bias and their gradients one that is f32 or that one; the states and
 * their gradients one that is f32 or that one. NULL: bias (none), h0 and c0
 * (zeros), h_final and c_final (not written), grad_h_final and grad_c_final
 * (none), and every backward output (not written; grad_bias and grad_h0
 * may be asked for without bias or h0). The backward reads the forward's y
 * and recomputes the gates; grad_rh is the gradient of h_{t-1} R + bias.
 * The forward is one launch, the backward three or four; sums in a fixed
 * order (bitwise deterministic).
 *
 * options (added in 0.2.0, with the stacks' functions too) may be NULL:
 * exact precision; zero-initialised options mean the same. Precision
 * EXPHIL_GATED_RNN_TF32 (f32 sequences only) runs the f32 products on
 * tensor cores at TF32's precision or better, as cuDNN does by default: the
 * forward's with R rounded to f16 (TF32's 11 significant bits; |R| below
 * 65504), the backward's with each operand in two bf16 halves, every sum
 * in f32 (exphil/gated_rnn.hpp, GatedRnnPrecision, says where a call runs
 * exact instead). With f16 and bf16 only EXPHIL_GATED_RNN_EXACT is
 * accepted.
 * ------------------------------------------------------------------------- */

typedef enum exphil_gated_rnn_precision {
  EXPHIL_GATED_RNN_EXACT = 0, /* f32 products in exact f32 FMAs */
  EXPHIL_GATED_RNN_TF32 = 1   /* f32 only: tensor cores, TF32's precision or better */
} exphil_gated_rnn_precision;

typedef struct exphil_gated_rnn_options {
  int32_t precision; /* an exphil_gated_rnn_precision */
} exphil_gated_rnn_options;

EXPHIL_API exphil_status exphil_gru_forward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* bias,
    const exphil_tensor* h0, const exphil_tensor* y, const exphil_tensor* h_final,
    const exphil_gated_rnn_options* options, exphil_stream stream);

EXPHIL_API exphil_status exphil_gru_backward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* y,
    const exphil_tensor* grad_y, const exphil_tensor* bias, const exphil_tensor* h0,
    const exphil_tensor* grad_h_final, const exphil_tensor* grad_wx,
    const exphil_tensor* grad_R, const exphil_tensor* grad_bias,
    const exphil_tensor* grad_h0, const exphil_tensor* grad_rh,
    const exphil_gated_rnn_options* options, exphil_stream stream);

EXPHIL_API exphil_status exphil_lstm_forward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* bias,
    const exphil_tensor* h0, const exphil_tensor* c0, const exphil_tensor* y,
    const exphil_tensor* h_final, const exphil_tensor* c_final,
    const exphil_gated_rnn_options* options, exphil_stream stream);

EXPHIL_API exphil_status exphil_lstm_backward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* y,
    const exphil_tensor* grad_y, const exphil_tensor* bias, const exphil_tensor* h0,
    const exphil_tensor* c0, const exphil_tensor* grad_h_final,
    const exphil_tensor* grad_c_final, const exphil_tensor* grad_wx,
    const exphil_tensor* grad_R, const exphil_tensor* grad_bias,
    const exphil_tensor* grad_h0, const exphil_tensor* grad_c0,
    const exphil_tensor* grad_rh, const exphil_gated_rnn_options* options, exphil_stream stream);

/* ---------------------------------------------------------------------------
 * gru_stack and lstm_stack: L = 2 to 4 stacked GRU or LSTM layers of one H,
 * forward and backward (added in 0.2.0; exphil/gated_rnn.hpp gives the math), as
 * torch.nn.GRU(H, H, L) and torch.nn.LSTM(H, H, L) run them: layer 0 on the
 * given wx, layer l > 0 on y_{l-1} W[l-1] + W_bias[l-1]. With K = L - 1:
 *
 *   wx [B, T, G*H];  R [L, H, G*H];  W [K, H, G*H];  bias [L, G*H];
 *   W_bias [K, G*H];  h0, c0, h_final, c_final [L, B, H];  y [B, T, H] (the
 *   last layer's);  y_lower [K, B, T, H] (the others')
 *
 * Dtypes as gru and lstm's, W and W_bias with R. NULL: bias and W_bias
 * (none), h0 and c0 (zeros), y_lower, h_final and c_final (not written).
 * Up to B = 4 one launch, the layers overlapping in time; above, the
 * layers one after another.
 * ------------------------------------------------------------------------- */

EXPHIL_API exphil_status exphil_gru_stack_forward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* W,
    const exphil_tensor* bias, const exphil_tensor* W_bias, const exphil_tensor* h0,
    const exphil_tensor* y, const exphil_tensor* y_lower, const exphil_tensor* h_final,
    const exphil_gated_rnn_options* options, exphil_stream stream);

EXPHIL_API exphil_status exphil_lstm_stack_forward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* W,
    const exphil_tensor* bias, const exphil_tensor* W_bias, const exphil_tensor* h0,
    const exphil_tensor* c0, const exphil_tensor* y, const exphil_tensor* y_lower,
    const exphil_tensor* h_final, const exphil_tensor* c_final,
    const exphil_gated_rnn_options* options, exphil_stream stream);

/* The stacks' backward (added in 0.2.0): from the forward's inputs, its y
 * and y_lower (both required: the backward reads every layer's y) and the
 * gradients of its outputs, the gradients of its inputs, shaped as they
 * are (grad_W and grad_W_bias as W and W_bias). NULL: bias, W_bias, h0, c0
 * as the forward; grad_y_lower, grad_h_final, grad_c_final (zeros); every
 * gradient output (not written; grad_bias, grad_W_bias, grad_h0 and grad_c0
 * may be asked for without their inputs). Each layer's backward (up to
 * B = 4 every layer's reverse walk in one launch, above one layer after
 * another from the top down), and per layer above the first three
 * products; sums in a fixed order (bitwise deterministic). */
EXPHIL_API exphil_status exphil_gru_stack_backward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* W,
    const exphil_tensor* y, const exphil_tensor* y_lower, const exphil_tensor* grad_y,
    const exphil_tensor* bias, const exphil_tensor* W_bias, const exphil_tensor* h0,
    const exphil_tensor* grad_y_lower, const exphil_tensor* grad_h_final,
    const exphil_tensor* grad_wx, const exphil_tensor* grad_R, const exphil_tensor* grad_W,
    const exphil_tensor* grad_bias, const exphil_tensor* grad_W_bias,
    const exphil_tensor* grad_h0, const exphil_gated_rnn_options* options, exphil_stream stream);

EXPHIL_API exphil_status exphil_lstm_stack_backward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* W,
    const exphil_tensor* y, const exphil_tensor* y_lower, const exphil_tensor* grad_y,
    const exphil_tensor* bias, const exphil_tensor* W_bias, const exphil_tensor* h0,
    const exphil_tensor* c0, const exphil_tensor* grad_y_lower,
    const exphil_tensor* grad_h_final, const exphil_tensor* grad_c_final,
    const exphil_tensor* grad_wx, const exphil_tensor* grad_R, const exphil_tensor* grad_W,
    const exphil_tensor* grad_bias, const exphil_tensor* grad_W_bias,
    const exphil_tensor* grad_h0, const exphil_tensor* grad_c0,
    const exphil_gated_rnn_options* options, exphil_stream stream);

/* ---------------------------------------------------------------------------
 * slstm: xLSTM's sLSTM (scalar LSTM with exponential gating) with the
 * recurrent product fused in, exactly as Edifice's slstm_scan computes it
 * (exphil/gated_rnn.hpp gives the math). Gates i, f, z, o side by side:
 *
 *   pre = wx_t + h_{t-1} R + bias
 *   m_t = max(pre_f + m_{t-1}, pre_i)
 *   i = exp(pre_i - m_t), f = exp(pre_f + m_{t-1} - m_t)
 *   c_t = f c_{t-1} + i tanh(pre_z),  n_t = f n_{t-1} + i
 *   h_t = sigmoid(pre_o) c_t / max(|n_t|, 1)
 *
 *   wx, grad_wx, grad_rh [B, T, 4H];  R, grad_R [H, 4H];  bias, grad_bias
 *   [4H];  h0, c0, n0, m0, the final states and all their gradients [B, H];
 *   y, grad_y [B, T, H]
 *
 * Dtypes as gru and lstm's. NULL: bias (none), h0, c0 and m0 (zeros), n0
 * (ones), the final states (not written), their gradients (zeros), and
 * every backward output (not written; the initial states' gradients may be
 * asked for without the states, at their defaults). The backward reads the
 * forward's y and recomputes the gates and the c, n, m states from it;
 * grad_rh (the gradient of h_{t-1} R + bias) equals grad_wx. At the ties of
 * max() the gradient is Nx's: half to each side. The forward is one launch,
 * the backward three or four; sums in a fixed order (bitwise deterministic).
 * ------------------------------------------------------------------------- */

EXPHIL_API exphil_status exphil_slstm_forward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* bias,
    const exphil_tensor* h0, const exphil_tensor* c0, const exphil_tensor* n0,
    const exphil_tensor* m0, const exphil_tensor* y, const exphil_tensor* h_final,
    const exphil_tensor* c_final, const exphil_tensor* n_final,
    const exphil_tensor* m_final, exphil_stream stream);

EXPHIL_API exphil_status exphil_slstm_backward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* y,
    const exphil_tensor* grad_y, const exphil_tensor* bias, const exphil_tensor* h0,
    const exphil_tensor* c0, const exphil_tensor* n0, const exphil_tensor* m0,
    const exphil_tensor* grad_h_final, const exphil_tensor* grad_c_final,
    const exphil_tensor* grad_n_final, const exphil_tensor* grad_m_final,
    const exphil_tensor* grad_wx, const exphil_tensor* grad_R,
    const exphil_tensor* grad_bias, const exphil_tensor* grad_h0,
    const exphil_tensor* grad_c0, const exphil_tensor* grad_n0,
    const exphil_tensor* grad_m0, const exphil_tensor* grad_rh, exphil_stream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXPHIL_EXPHIL_H */
