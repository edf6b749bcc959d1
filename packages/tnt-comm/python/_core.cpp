// The private extension module behind `tnt_comm`: a thin binding of the C++ API. Buffers arrive as
// addresses already checked by the Python layer (tnt_comm/__init__.py); every wait releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tnt_comm/build_info.hpp"
#include "tnt_comm/c_api.h"
#include "tnt_comm/tnt_comm.hpp"

namespace py = pybind11;
using tnt::DType;
using tnt::ReduceOp;

namespace {

struct View {
  void* ptr;
  std::size_t count;
  DType dtype;
};

DType dtype_of(const py::array& a, const char* name) {
  // Byte-swapped data would be reduced as if native: refuse it. ('|' and '=' are native.)
  const char order = a.dtype().byteorder();
  constexpr char kForeign = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? '>' : '<';
  if (order == kForeign) {
    const std::string name_str = py::str(a.dtype().attr("name")).cast<std::string>();
    throw py::type_error(std::string(name) + " has dtype " + py::str(a.dtype().attr("str")).cast<std::string>() +
                         ", whose byte order is not this machine's; convert it with .astype('" + name_str +
                         "') (tnt_comm reduces values in native byte order only)");
  }
  switch (a.dtype().num()) {
    case py::detail::npy_api::NPY_FLOAT_: return DType::float32;
    case py::detail::npy_api::NPY_DOUBLE_: return DType::float64;
    case py::detail::npy_api::NPY_UBYTE_: return DType::uint8;
    default: break;
  }
  // Integer and half types have platform-dependent numbers: go by kind and size.
  const char kind = a.dtype().kind();
  const auto size = a.dtype().itemsize();
  if (kind == 'i' && size == 4) return DType::int32;
  if (kind == 'i' && size == 8) return DType::int64;
  if (kind == 'f' && size == 2) return DType::float16;
  if (size == 2 && py::str(a.dtype().attr("name")).cast<std::string>() == "bfloat16") {
    return DType::bfloat16;
  }
  throw py::type_error(std::string(name) + " has dtype " +
                       py::str(a.dtype().attr("name")).cast<std::string>() +
                       ", which tnt_comm does not support; use float16, bfloat16, float32, "
                       "float64, int32, int64 or uint8 (convert with .astype(...))");
}

View view(const py::array& a, const char* name, bool writable) {
  if (!(a.flags() & py::array::c_style)) {
    throw py::value_error(std::string(name) +
                          " must be C-contiguous; pass np.ascontiguousarray(" + name + ")");
  }
  if (writable && !a.writeable()) {
    throw py::value_error(std::string(name) + " is read-only; pass a writable array");
  }
  DType d = dtype_of(a, name);
  return View{const_cast<void*>(a.data()), static_cast<std::size_t>(a.size()), d};
}

void same_layout(const View& in, const View& out, std::size_t count, const char* name) {
  if (out.dtype != in.dtype) {
    throw py::type_error(std::string(name) + " has dtype " + tnt::dtype_name(out.dtype) +
                         " but the input has " + tnt::dtype_name(in.dtype));
  }
  if (out.count != count) {
    throw py::value_error(std::string(name) + " has " + std::to_string(out.count) +
                          " elements but " + std::to_string(count) + " are needed");
  }
}

// Names this thread after its Python thread, once per thread, so that calls paired across ranks
// from threads of different names raise (tnt::set_thread_name). The main thread and threads
// Python did not start (a framework's pool) stay unnamed. Needs the GIL.
void name_this_thread() {
  thread_local bool named = false;
  if (named) return;
  named = true;
  py::module_ threading = py::module_::import("threading");
  py::object current = threading.attr("current_thread")();
  if (current.is(threading.attr("main_thread")()) ||
      py::isinstance(current, threading.attr("_DummyThread"))) {
    return;
  }
  tnt::set_thread_name(py::str(current.attr("name")).cast<std::string>());
}

tnt::Group& group_or_world(tnt::Group* g) { return g != nullptr ? *g : tnt::Runtime::init().world(); }

// The one body of every collective binding: names the thread, releases the GIL and runs the
// blocking form (returning None) or starts the non-blocking one (returning its Work).
template <typename Blocking, typename Async>
std::optional<tnt::Work> collective(tnt::Group* g, bool blocking, const Blocking& now, const Async& later) {
  name_this_thread();
  py::gil_scoped_release release;
  tnt::Group& grp = group_or_world(g);
  if (blocking) {
    now(grp);
    return std::nullopt;
  }
  return later(grp);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "tnt-comm native core (private; use the tnt_comm package)";

  static py::exception<tnt::Error> base(m, "TntError", PyExc_RuntimeError);
  static py::exception<tnt::CollectiveMismatch> mismatch(m, "CollectiveMismatch", base.ptr());
  static py::exception<tnt::PeerFailure> peer_failure(m, "PeerFailure", base.ptr());
  static py::exception<tnt::InvalidArgument> invalid(m, "InvalidArgument", PyExc_ValueError);
  static py::handle timeout_type = [] {
    py::tuple bases = py::make_tuple(base, py::reinterpret_borrow<py::object>(PyExc_TimeoutError));
    return py::handle(PyErr_NewException("tnt_comm._core.Timeout", bases.ptr(), nullptr));
  }();
  m.attr("Timeout") = timeout_type;
  py::register_exception_translator([](std::exception_ptr p) {
    // The Python exception carries the error's data as attributes (tnt_comm's docs list them).
    auto raise = [](py::handle type, const tnt::Error& e) {
      const tnt::ErrorDetail& d = e.detail();
      py::object exc = py::reinterpret_borrow<py::object>(type)(e.what());
      exc.attr("ranks") = py::cast(d.ranks);
      exc.attr("operation") = d.operation.empty() ? py::none() : py::object(py::str(d.operation));
      exc.attr("group") = d.group == 0 ? py::none() : py::object(py::int_(d.group));
      exc.attr("call") = d.call < 0 ? py::none() : py::object(py::int_(d.call));
      exc.attr("mine") = d.mine.empty() ? py::none() : py::object(py::str(d.mine));
      exc.attr("theirs") = d.theirs.empty() ? py::none() : py::object(py::str(d.theirs));
      exc.attr("peer_error") = d.peer_error.empty() ? py::none() : py::object(py::str(d.peer_error));
      PyErr_SetObject(type.ptr(), exc.ptr());
      return exc;
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tnt::PeerFailure& e) {
      raise(peer_failure, e).attr("rank") = e.rank();
    } catch (const tnt::CollectiveMismatch& e) {
      raise(mismatch, e);
    } catch (const tnt::Timeout& e) {
      raise(timeout_type, e);
    } catch (const tnt::InvalidArgument& e) {
      raise(invalid, e);
    } catch (const tnt::Error& e) {
      raise(base, e);
    }
  });

  m.def("init", [] { tnt::Runtime::init(); }, py::call_guard<py::gil_scoped_release>());
  m.def("finalize", [] { tnt::Runtime::finalize(); }, py::call_guard<py::gil_scoped_release>());
  m.def("abandon", [](const std::string& error) { tnt::Runtime::abandon(error); },
        py::call_guard<py::gil_scoped_release>());
  m.def("is_initialized", [] { return tnt::Runtime::get() != nullptr; });
  m.def("shrink", [] { tnt::Runtime::shrink(); }, py::call_guard<py::gil_scoped_release>());
  m.def("admit", [] { return tnt::Runtime::admit(); }, py::call_guard<py::gil_scoped_release>());
  m.def("membership", [] {
    const tnt::Runtime& rt = tnt::Runtime::init();
    return py::make_tuple(rt.generation(), rt.members());
  });
  py::class_<tnt::StoreService>(m, "StoreService")
      .def(py::init<const std::string&, int, const std::string&>())
      .def_property_readonly("port", &tnt::StoreService::port);
  // The timeline (tnt_comm/timeline.hpp): switched on and off, and its events taken, as tuples
  // (name, group, call, bytes, submitted_ns, started_ns, ended_ns, blocking, failed, algorithm,
  // phases as (name, begin_ns)).
  m.def("timeline_set", [](bool on) { tnt::timeline::set(on); });
  m.def("timeline_now_ns", [] { return tnt::timeline::now_ns(); });
  m.def("timeline_take", [] {
    py::list out;
    for (const auto& e : tnt::timeline::take()) {
      py::list phases;
      for (const auto& phase : e.phases) phases.append(py::make_tuple(phase.name, phase.begin_ns));
      out.append(py::make_tuple(e.name, e.group, e.call, e.bytes, e.submitted_ns, e.started_ns, e.ended_ns,
                                e.blocking, e.failed, e.algorithm, phases));
    }
    return out;
  });
  m.def("identity", [] {
    const tnt::Identity& id = tnt::Runtime::init().identity();
    py::dict d;
    d["rank"] = id.rank;
    d["size"] = id.size;
    d["local_rank"] = id.local_rank;
    d["local_size"] = id.local_size;
    d["node_rank"] = id.node_rank;
    d["job_id"] = id.job_id;
    d["timeout_s"] = id.timeout_s;
    d["start_timeout_s"] = id.start_timeout_s;
    d["elastic_min"] = id.elastic_min;
    return d;
  });
  m.def("transports", [] { return tnt::Runtime::init().transports(); });
  // What this build was compiled with; needs no running job.
  m.def("build_info", [] {
    py::dict d;
    const tnt::BuildInfo info = tnt::build_info();
    d["transports"] = info.transports;
    if (info.gpi2_version.empty()) {
      d["gpi2"] = py::none();  // no GPI-2 transport in this build (TNT_TRANSPORT=gpi2 is refused)
    } else {
      py::dict g;
      g["version"] = info.gpi2_version;
      g["prefix"] = info.gpi2_prefix;
      g["network"] = info.gpi2_network;
      d["gpi2"] = g;
    }
#if defined(__clang__)
    d["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
    d["compiler"] = std::string("GCC ") + __VERSION__;
#else
    d["compiler"] = std::string("unknown");
#endif
    d["cxx_standard"] = static_cast<long>(__cplusplus);
    return d;
  });
  m.def("dtype_size", [](int dtype) { return tnt::dtype_size(static_cast<DType>(dtype)); });

  py::class_<tnt::Work>(m, "Work")
      .def("wait", &tnt::Work::wait, py::arg("timeout") = std::nullopt,
           py::call_guard<py::gil_scoped_release>())
      .def("is_completed", &tnt::Work::is_completed)
      .def("failed", &tnt::Work::failed)
      .def("rethrow", &tnt::Work::rethrow);

  py::class_<tnt::Group, std::shared_ptr<tnt::Group>>(m, "Group")
      .def_property_readonly("rank", &tnt::Group::rank)
      .def_property_readonly("size", &tnt::Group::size)
      .def_property_readonly("ranks", &tnt::Group::world_ranks)
      .def_property_readonly("id", &tnt::Group::id);

  m.def("world", [] { return tnt::Runtime::init().world_group(); });
  m.def("new_group", [](std::vector<int> ranks) { return tnt::Runtime::init().new_group(std::move(ranks)); });

  // Collectives take numpy arrays (the Python layer turns other buffers into arrays without
  // copying); checks happen here, in C++, to keep small blocking calls within a microsecond or so.
  // Each binding checks its buffers, then hands `collective` the blocking and non-blocking forms.
  m.def("allreduce", [](tnt::Group* g, const py::array& in, const py::array& out, int op, bool blocking) {
    const View a = view(in, "x", false), o = view(out, "out", true);
    same_layout(a, o, a.count, "out");
    const auto reduce = static_cast<ReduceOp>(op);
    return collective(
        g, blocking, [&](tnt::Group& grp) { grp.allreduce(a.ptr, o.ptr, a.count, a.dtype, reduce); },
        [&](tnt::Group& grp) { return grp.allreduce_async(a.ptr, o.ptr, a.count, a.dtype, reduce); });
  });
  m.def("broadcast", [](tnt::Group* g, const py::array& buf, int root, bool blocking) {
    const View a = view(buf, "x", true);
    return collective(
        g, blocking, [&](tnt::Group& grp) { grp.broadcast(a.ptr, a.count, a.dtype, root); },
        [&](tnt::Group& grp) { return grp.broadcast_async(a.ptr, a.count, a.dtype, root); });
  });
  m.def("allgather", [](tnt::Group* g, const py::array& in, const py::array& out, bool blocking) {
    const View a = view(in, "x", false), o = view(out, "out", true);
    same_layout(a, o, a.count * static_cast<std::size_t>(group_or_world(g).size()), "out");
    return collective(
        g, blocking, [&](tnt::Group& grp) { grp.allgather(a.ptr, o.ptr, a.count, a.dtype); },
        [&](tnt::Group& grp) { return grp.allgather_async(a.ptr, o.ptr, a.count, a.dtype); });
  });
  m.def("allgatherv", [](tnt::Group* g, const py::array& in, const py::array& out,
                         std::vector<std::size_t> counts) {
    name_this_thread();
    const View a = view(in, "x", false), o = view(out, "out", true);
    py::gil_scoped_release release;
    group_or_world(g).allgatherv(a.ptr, o.ptr, counts, a.dtype);
  });
  m.def("reduce_scatter", [](tnt::Group* g, const py::array& in, const py::array& out, int op, bool blocking) {
    const View a = view(in, "x", false), o = view(out, "out", true);
    same_layout(a, o, a.count / static_cast<std::size_t>(group_or_world(g).size()), "out");
    const auto reduce = static_cast<ReduceOp>(op);
    return collective(
        g, blocking, [&](tnt::Group& grp) { grp.reduce_scatter(a.ptr, o.ptr, o.count, a.dtype, reduce); },
        [&](tnt::Group& grp) { return grp.reduce_scatter_async(a.ptr, o.ptr, o.count, a.dtype, reduce); });
  });
  m.def("barrier", [](tnt::Group* g, bool blocking) {
    return collective(
        g, blocking, [](tnt::Group& grp) { grp.barrier(); }, [](tnt::Group& grp) { return grp.barrier_async(); });
  });
  m.def("send", [](tnt::Group* g, const py::array& buf, int peer, bool blocking) {
    const View a = view(buf, "x", false);
    return collective(
        g, blocking, [&](tnt::Group& grp) { grp.send(a.ptr, a.count, a.dtype, peer); },
        [&](tnt::Group& grp) { return grp.send_async(a.ptr, a.count, a.dtype, peer); });
  });
  m.def("recv", [](tnt::Group* g, const py::array& buf, int peer, bool blocking) {
    const View a = view(buf, "out", true);
    return collective(
        g, blocking, [&](tnt::Group& grp) { grp.recv(a.ptr, a.count, a.dtype, peer); },
        [&](tnt::Group& grp) { return grp.recv_async(a.ptr, a.count, a.dtype, peer); });
  });

  // A block of the rank's shared arena (Runtime::allocate_shared), as a writable byte buffer that
  // keeps the block alive for whatever views it.
  struct SharedBlock {
    std::shared_ptr<void> memory;
    std::size_t bytes;
  };
  py::class_<SharedBlock>(m, "SharedBlock", py::buffer_protocol())
      .def_buffer([](SharedBlock& b) {
        return py::buffer_info(b.memory.get(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.bytes)}, {1});
      });
  m.def("allocate_shared", [](std::size_t bytes) -> py::object {
    std::shared_ptr<void> memory = tnt::Runtime::init().allocate_shared(bytes);
    if (!memory) return py::none();
    return py::cast(SharedBlock{std::move(memory), bytes});
  });

  m.def("plan_buckets", [](std::vector<std::size_t> counts, std::vector<int> dtypes,
                           std::size_t threshold) {
    if (counts.size() != dtypes.size()) throw tnt::InvalidArgument("counts and dtypes differ in length");
    std::vector<tnt::TensorSpec> specs;
    for (std::size_t i = 0; i < counts.size(); ++i) specs.push_back({counts[i], static_cast<DType>(dtypes[i])});
    std::vector<std::vector<std::size_t>> out;
    for (const auto& b : tnt::plan_buckets(specs, threshold)) out.push_back(b.tensors);
    return out;
  });

  py::class_<tnt::FusedAllreduce>(m, "FusedAllreduce")
      .def(py::init([](tnt::Group* g, std::vector<std::size_t> counts, std::vector<int> dtypes,
                       std::size_t threshold, int op) {
             if (counts.size() != dtypes.size()) {
               throw tnt::InvalidArgument("counts and dtypes differ in length");
             }
             std::vector<tnt::TensorSpec> specs;
             for (std::size_t i = 0; i < counts.size(); ++i) {
               specs.push_back({counts[i], static_cast<DType>(dtypes[i])});
             }
             return std::make_unique<tnt::FusedAllreduce>(group_or_world(g), std::move(specs),
                                                          threshold, static_cast<ReduceOp>(op));
           }),
           py::keep_alive<1, 2>())
      .def(
          "start",
          [](tnt::FusedAllreduce& f, std::size_t i, const py::array& x, std::optional<float> scale) {
            name_this_thread();
            View a = view(x, "x", false);
            py::gil_scoped_release release;
            f.start(i, a.ptr, scale ? &*scale : nullptr);
          },
          py::arg("i"), py::arg("x"), py::arg("scale") = py::none())
      .def("wait",
           [](tnt::FusedAllreduce& f, std::size_t i, const py::array& out) {
             View o = view(out, "out", true);
             py::gil_scoped_release release;
             f.wait(i, o.ptr);
           })
      .def("is_ready", &tnt::FusedAllreduce::is_ready)
      .def_property_readonly("buckets", [](const tnt::FusedAllreduce& f) {
        std::vector<std::vector<std::size_t>> out;
        for (const auto& b : f.buckets()) out.push_back(b.tensors);
        return out;
      });

  // The C ABI table for other native extensions (see c_api.h).
  m.attr("_C_API") = py::capsule(const_cast<tnt_comm_api_v3*>(tnt_comm_api()), TNT_COMM_C_API_CAPSULE);
}
