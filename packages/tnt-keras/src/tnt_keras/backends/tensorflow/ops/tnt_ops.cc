// TensorFlow ops that hand a tensor to tnt_comm's engine and let TensorFlow go on meanwhile.
//
// TntAllreduceStart (stateful, synchronous): allocates the output, submits the allreduce through
// the tnt_comm C ABI and returns a handle. Stateful so that tf.function's automatic control
// dependencies run every start in program order: that keeps the order of collectives identical on
// all ranks, and it also keeps TensorFlow from pruning, CSE'ing or constant-folding a start.
//
// TntAllreduceWait (not stateful, asynchronous): completes when the collective does. Not stateful
// so that TensorFlow does not chain the waits, which then finish in any order while backprop runs.
// ComputeAsync only registers TensorFlow's `done`; the engine's completion callback (on tnt_comm's
// progress thread) forwards the result and calls it. No inter-op thread is ever blocked.
//
// TntFusedSumStart / TntFusedSumWait do the same for a list of tensors in one collective, through
// tnt-comm's tensor fusion (the C ABI's fused_layout and fused_allreduce_async, which its
// FusedAllreduce uses too): every input is copied, optionally times a scale, into one flat buffer
// at 64-byte aligned offsets, which is summed in place; the wait's outputs are views into it. The
// buffer lies in tnt_comm's shared arena where there is one, so that large buckets take its
// single-copy allreduce. Gradient fusion so costs one
// pass over the gradients instead of three (scale, concatenate, split into copies).
//
// Built by tnt_keras/backends/tensorflow/ops/_build.py against the installed TensorFlow; see there for the flags.
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tnt_comm/c_api.h"
#include "tnt_comm/error_data.hpp"

namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::TensorShapeUtils;
using tensorflow::shape_inference::InferenceContext;

// The one global of this library: tnt_comm's C ABI table, handed over once from Python
// (tnt_ops_set_api) right after loading. It must be process-wide because the op kernels are
// created by TensorFlow, which offers no way to pass them a pointer, and it must be the table of
// the already imported tnt_comm module so the op uses the same runtime (connections, sequence
// numbers) as tnt_comm's Python API instead of a second copy of it. Set once, read lock-free.
std::atomic<const tnt_comm_api_v3*> g_api{nullptr};

constexpr std::uint64_t kMagic = 0x746e745f70656e64ULL;  // "tnt_pend": catches most misused handles

// One allreduce in flight. Two references: the engine's (dropped by its completion callback) and
// the handle's (dropped by the wait that consumes it). A handle that is never waited for leaks this
// small object, but not the tensors: those are released as soon as the collective completes.
struct Pending {
  std::uint64_t magic = kMagic;
  std::atomic<int> refs{2};
  std::mutex mu;
  bool completed = false;  // guarded by mu, like everything below
  bool failed = false;
  std::string error;       // tnt-comm's sentence
  std::string error_data;  // the same error as data (tnt::error_data_json)
  Tensor input;   // kept alive while the engine reads from it
  Tensor output;  // kept alive while the engine writes into it, even if the wait is pruned
  // Fused sums only: where each input lies in the flat output, and its shape.
  std::vector<std::int64_t> offsets;
  std::vector<TensorShape> shapes;
  OpKernelContext* waiter = nullptr;
  AsyncOpKernel::DoneCallback waiter_done;

  void Unref() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      magic = 0;
      delete this;
    }
  }
};

// The payload key under which a failed op's Status carries tnt-comm's error as data (tnt_keras reads
// it from tf.errors.OpError.experimental_payloads; TensorFlow keeps a Status' payloads).
constexpr char kErrorPayload[] = "tnt_comm.error";

absl::Status ErrorStatus(const std::string& what, const std::string& message, const std::string& data) {
  absl::Status status = absl::InternalError(absl::StrCat(what, message));
  status.SetPayload(kErrorPayload, absl::Cord(data));
  return status;
}

// Sets the wait's results: the start's output forwarded without a copy (for a fused sum, one view
// into it per input), or the engine's error.
void Complete(OpKernelContext* ctx, const Pending& p) {
  if (p.failed) {
    ctx->CtxFailure(ErrorStatus("tnt_comm allreduce failed: ", p.error, p.error_data));
    return;
  }
  if (p.shapes.empty()) {
    ctx->set_output(0, ctx->input(1));
    return;
  }
  const Tensor& flat = ctx->input(1);
  for (std::size_t i = 0; i < p.shapes.size(); ++i) {
    const std::int64_t begin = p.offsets[i];
    Tensor view;
    // Slice shares the buffer (and views never own it, so TensorFlow never reuses it in place).
    if (!view.CopyFrom(flat.Slice(begin, begin + p.shapes[i].num_elements()), p.shapes[i])) {
      ctx->CtxFailure(absl::InternalError("TntFusedSumWait: a view does not fit its shape"));
      return;
    }
    ctx->set_output(static_cast<int>(i), view);
  }
}

// tnt_comm's completion callback: runs on the progress thread (or inline if submission fails
// late), so it only takes a short lock, and TensorFlow's `done` only schedules the ready ops.
void OnDone(void* ctx, const tnt_comm_error* error) {
  auto* p = static_cast<Pending*>(ctx);
  OpKernelContext* waiter = nullptr;
  AsyncOpKernel::DoneCallback done;
  {
    Tensor input, output;  // the buffers are released after the unlock, before `done`
    std::lock_guard<std::mutex> lock(p->mu);
    p->completed = true;
    if (error != nullptr) {
      p->failed = true;
      p->error = error->message;
      p->error_data = tnt::error_data_json(*error);
    }
    std::swap(input, p->input);
    std::swap(output, p->output);
    waiter = p->waiter;
    done = std::move(p->waiter_done);
  }
  if (waiter != nullptr) {
    Complete(waiter, *p);
    done();
    p->Unref();  // the handle's reference, handed over by the wait
  }
  p->Unref();
}

std::int32_t DTypeCode(DataType t) {
  switch (t) {
    case tensorflow::DT_HALF: return TNT_COMM_FLOAT16;
    case tensorflow::DT_BFLOAT16: return TNT_COMM_BFLOAT16;
    case tensorflow::DT_FLOAT: return TNT_COMM_FLOAT32;
    case tensorflow::DT_DOUBLE: return TNT_COMM_FLOAT64;
    case tensorflow::DT_INT32: return TNT_COMM_INT32;
    case tensorflow::DT_INT64: return TNT_COMM_INT64;
    case tensorflow::DT_UINT8: return TNT_COMM_UINT8;
    default: return -1;
  }
}

std::int32_t OpCode(const std::string& op) {
  if (op == "sum") return TNT_COMM_SUM;
  if (op == "prod") return TNT_COMM_PROD;
  if (op == "min") return TNT_COMM_MIN;
  if (op == "max") return TNT_COMM_MAX;
  if (op == "avg") return TNT_COMM_AVG;
  return -1;
}

// Completes a start: `started` is what the C ABI's start call returned for `p`. A start that
// failed deletes p (the callback will not run and nobody else knows it) and fails the kernel.
void Started(OpKernelContext* ctx, const tnt_comm_api_v3* api, Pending* p, int started) {
  if (started == 0) return;
  const tnt_comm_error* error = api->last_error();
  delete p;
  ctx->CtxFailure(ErrorStatus("tnt_comm allreduce could not start: ", error->message, tnt::error_data_json(*error)));
}

class AllreduceStartOp : public OpKernel {
 public:
  explicit AllreduceStartOp(OpKernelConstruction* c) : OpKernel(c) {
    DataType t;
    OP_REQUIRES_OK(c, c->GetAttr("T", &t));
    std::string reduction;
    OP_REQUIRES_OK(c, c->GetAttr("reduction", &reduction));
    dtype_ = DTypeCode(t);
    op_ = OpCode(reduction);
    OP_REQUIRES(c, dtype_ >= 0, absl::InvalidArgumentError("TntAllreduceStart: unsupported dtype"));
    OP_REQUIRES(c, op_ >= 0,
                absl::InvalidArgumentError(
                    absl::StrCat("TntAllreduceStart: unknown reduction ", reduction)));
  }

  void Compute(OpKernelContext* ctx) override {
    const tnt_comm_api_v3* api = g_api.load(std::memory_order_acquire);
    OP_REQUIRES(ctx, api != nullptr,
                absl::FailedPreconditionError("tnt_comm's C API was not handed to the op library; "
                                              "load it through tnt_keras.backends.tensorflow.ops"));
    const Tensor& input = ctx->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, input.shape(), &output));
    Tensor* handle = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &handle));

    auto* p = new Pending;
    p->input = input;
    p->output = *output;
    handle->scalar<std::int64_t>()() = reinterpret_cast<std::intptr_t>(p);
    // Group 0: the world, the group of every rank tnt-keras trains on.
    Started(ctx, api, p,
            api->allreduce_async(0, input.data(), output->data(), static_cast<std::uint64_t>(input.NumElements()),
                                 dtype_, op_, &OnDone, p));
  }

 private:
  std::int32_t dtype_ = -1;
  std::int32_t op_ = -1;
};

// A tensor's memory in tnt_comm's shared arena (the C ABI's alloc_shared), returned when the last
// tensor or view of it goes.
class SharedBuffer : public tensorflow::TensorBuffer {
 public:
  SharedBuffer(void* block, std::size_t bytes, const tnt_comm_api_v3* api)
      : TensorBuffer(block), bytes_(bytes), api_(api) {}
  ~SharedBuffer() override { api_->free_shared(data()); }
  std::size_t size() const override { return bytes_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<std::int64_t>(bytes_));
    proto->set_allocated_bytes(static_cast<std::int64_t>(bytes_));
    proto->set_allocator_name("tnt_comm_shared_arena");
  }

 private:
  std::size_t bytes_;
  const tnt_comm_api_v3* api_;
};

class FusedSumStartOp : public OpKernel {
 public:
  explicit FusedSumStartOp(OpKernelConstruction* c) : OpKernel(c) {
    DataType t;
    OP_REQUIRES_OK(c, c->GetAttr("T", &t));
    OP_REQUIRES_OK(c, c->GetAttr("scaled", &scaled_));
    dtype_ = DTypeCode(t);
    OP_REQUIRES(c, dtype_ >= 0, absl::InvalidArgumentError("TntFusedSumStart: unsupported dtype"));
    const bool floating = t == tensorflow::DT_HALF || t == tensorflow::DT_BFLOAT16 ||
                          t == tensorflow::DT_FLOAT || t == tensorflow::DT_DOUBLE;
    OP_REQUIRES(c, floating || !scaled_,
                absl::InvalidArgumentError("TntFusedSumStart: only floating-point sums take a scale"));
    element_ = tensorflow::DataTypeSize(t);
  }

  void Compute(OpKernelContext* ctx) override {
    const tnt_comm_api_v3* api = g_api.load(std::memory_order_acquire);
    OP_REQUIRES(ctx, api != nullptr,
                absl::FailedPreconditionError("tnt_comm's C API was not handed to the op library; "
                                              "load it through tnt_keras.backends.tensorflow.ops"));
    tensorflow::OpInputList inputs;
    OP_REQUIRES_OK(ctx, ctx->input_list("inputs", &inputs));
    const Tensor& scale_tensor = ctx->input(inputs.size());
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(scale_tensor.shape()),
                absl::InvalidArgumentError("TntFusedSumStart: the scale must be a scalar"));
    const float scale = scale_tensor.scalar<float>()();

    // tnt-comm lays the tensors out (64-byte aligned offsets), copies and scales them in, and sums.
    const auto n = static_cast<std::uint32_t>(inputs.size());
    std::vector<std::uint64_t> counts(n), offsets(n);
    std::vector<const void*> sources(n);
    std::vector<TensorShape> shapes;
    for (std::uint32_t i = 0; i < n; ++i) {
      counts[i] = static_cast<std::uint64_t>(inputs[i].NumElements());
      sources[i] = inputs[i].data();
      shapes.push_back(inputs[i].shape());
    }
    const auto total = static_cast<std::int64_t>(api->fused_layout(n, counts.data(), dtype_, offsets.data()));

    // The flat buffer lives in tnt_comm's shared arena where the rank has one, so a large bucket
    // on one host takes the single-copy allreduce; in TensorFlow's memory otherwise.
    Tensor* output = nullptr;
    const auto nbytes = static_cast<std::uint64_t>(total * element_);
    void* block = nullptr;
    if (nbytes > 0 && api->alloc_shared(nbytes, &block) != 0) {
      const tnt_comm_error* error = api->last_error();
      ctx->CtxFailure(ErrorStatus("tnt_comm could not allocate a gradient bucket: ", error->message, tnt::error_data_json(*error)));
      return;
    }
    if (block != nullptr) {
      tensorflow::core::RefCountPtr<tensorflow::TensorBuffer> buffer(new SharedBuffer(block, nbytes, api));
      ctx->set_output(0, Tensor(inputs[0].dtype(), TensorShape({total}), std::move(buffer)));
      output = ctx->mutable_output(0);
    } else {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &output));
    }
    Tensor* handle = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &handle));

    auto* p = new Pending;
    p->output = *output;
    p->offsets.assign(offsets.begin(), offsets.end());
    p->shapes = std::move(shapes);
    handle->scalar<std::int64_t>()() = reinterpret_cast<std::intptr_t>(p);
    Started(ctx, api, p,
            api->fused_allreduce_async(0, n, sources.data(), counts.data(), output->data(), dtype_, TNT_COMM_SUM,
                                       scaled_ ? &scale : nullptr, &OnDone, p));
  }

 private:
  std::int32_t dtype_ = -1;
  bool scaled_ = false;
  std::int64_t element_ = 1;
};

class AllreduceWaitOp : public AsyncOpKernel {
 public:
  explicit AllreduceWaitOp(OpKernelConstruction* c) : AsyncOpKernel(c) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& h = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, TensorShapeUtils::IsScalar(h.shape()),
                      absl::InvalidArgumentError("TntAllreduceWait: the handle must be a scalar"),
                      done);
    auto* p = reinterpret_cast<Pending*>(static_cast<std::intptr_t>(h.scalar<std::int64_t>()()));
    OP_REQUIRES_ASYNC(ctx, p != nullptr && p->magic == kMagic,
                      absl::InvalidArgumentError("TntAllreduceWait: not a live handle of "
                                                 "TntAllreduceStart (wait for each handle once)"),
                      done);
    bool twice = false;
    {
      std::lock_guard<std::mutex> lock(p->mu);
      twice = p->waiter != nullptr;
      if (!twice && !p->completed) {
        // The callback completes us; from here on neither ctx nor p may be touched.
        p->waiter = ctx;
        p->waiter_done = std::move(done);
        return;
      }
    }
    OP_REQUIRES_ASYNC(ctx, !twice,
                      absl::InvalidArgumentError("TntAllreduceWait: a handle waited for twice"),
                      done);
    Complete(ctx, *p);
    p->Unref();
    done();
  }
};

}  // namespace

// Hands tnt_comm's C ABI table (from the capsule tnt_comm._core._C_API) to this library. Returns 0
// on success (also when the same table is handed again), 1 for a null table, 2 for a table of
// another ABI version, 3 when a different table was already set.
extern "C" __attribute__((visibility("default"))) int tnt_ops_set_api(const void* table) {
  const auto* api = static_cast<const tnt_comm_api_v3*>(table);
  if (api == nullptr) return 1;
  if (api->version != TNT_COMM_C_API_VERSION) return 2;
  const tnt_comm_api_v3* expected = nullptr;
  if (g_api.compare_exchange_strong(expected, api, std::memory_order_acq_rel)) return 0;
  return expected == api ? 0 : 3;
}

// The ABI version this library was compiled for, for error messages.
extern "C" __attribute__((visibility("default"))) int tnt_ops_api_version(void) {
  return TNT_COMM_C_API_VERSION;
}

REGISTER_OP("TntAllreduceStart")
    .Input("input: T")
    .Output("output: T")
    .Output("handle: int64")
    .Attr("T: {half, bfloat16, float, double, int32, int64, uint8}")
    .Attr("reduction: {'sum', 'prod', 'min', 'max', 'avg'} = 'sum'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Starts an allreduce of `input` over every rank of the tnt_comm world and returns at once.
`output` holds the result only after TntAllreduceWait on `handle` completes. Stateful, so the
starts of a tf.function run in program order, the same order on every rank.
)doc");

REGISTER_OP("TntAllreduceWait")
    .Input("handle: int64")
    .Input("result: T")
    .Input("input: T")
    .Output("output: T")
    .Attr("T: {half, bfloat16, float, double, int32, int64, uint8}")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Completes when the allreduce started as `handle` does and forwards `result` (the start's output).
`input` is the start's input, taken so that it stays alive until then.
)doc");

REGISTER_OP("TntFusedSumStart")
    .Input("inputs: N * T")
    .Input("scale: float")
    .Output("output: T")
    .Output("handle: int64")
    .Attr("T: {half, bfloat16, float, double, int32, int64, uint8}")
    .Attr("N: int >= 1")
    .Attr("scaled: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Starts one allreduce (sum) of all `inputs`, each times `scale` if `scaled` (0 where `scale` is 0,
even for NaN inputs), copied into `output` at 64-byte aligned offsets. Stateful, like
TntAllreduceStart. The sums are read through TntFusedSumWait.
)doc");

REGISTER_OP("TntFusedSumWait")
    .Input("handle: int64")
    .Input("result: T")
    .Output("outputs: N * T")
    .Attr("T: {half, bfloat16, float, double, int32, int64, uint8}")
    .Attr("N: int >= 1")
    .Attr("shapes: list(shape)")
    .SetShapeFn([](InferenceContext* c) {
      std::vector<tensorflow::PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
      if (static_cast<int>(shapes.size()) != c->num_outputs()) {
        return absl::InvalidArgumentError("TntFusedSumWait: one shape per output");
      }
      for (int i = 0; i < c->num_outputs(); ++i) {
        tensorflow::shape_inference::ShapeHandle shape;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &shape));
        c->set_output(i, shape);
      }
      return absl::OkStatus();
    })
    .Doc(R"doc(
Completes when the fused sum started as `handle` does; `outputs` are views of `result` (the
start's output) in the inputs' shapes.
)doc");

REGISTER_KERNEL_BUILDER(Name("TntAllreduceStart").Device(tensorflow::DEVICE_CPU), AllreduceStartOp);
REGISTER_KERNEL_BUILDER(Name("TntAllreduceWait").Device(tensorflow::DEVICE_CPU), AllreduceWaitOp);
REGISTER_KERNEL_BUILDER(Name("TntFusedSumStart").Device(tensorflow::DEVICE_CPU), FusedSumStartOp);
REGISTER_KERNEL_BUILDER(Name("TntFusedSumWait").Device(tensorflow::DEVICE_CPU), AllreduceWaitOp);
