#include "comm/collectives.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>
#include <vector>

namespace hybrid {

namespace {

// c10d's functional collective `op_name` (its group by name, the result a fresh tensor), waited at once.
at::Tensor functional_collective(const char* op_name, torch::jit::Stack args) {
  c10::Dispatcher::singleton().findSchemaOrThrow(op_name, "").callBoxed(&args);
  torch::jit::Stack wait{args.at(0)};
  c10::Dispatcher::singleton().findSchemaOrThrow("_c10d_functional::wait_tensor", "").callBoxed(&wait);
  return wait.at(0).toTensor();
}

c10::intrusive_ptr<c10d::Work> all_reduce(at::Tensor& tensor, const GroupPtr& group, c10d::ReduceOp op) {
  if (is_traced(tensor)) {
    const std::string name = op == c10d::ReduceOp::SUM ? "sum" : "max";
    tensor = functional_collective("_c10d_functional::all_reduce", {tensor, name, group->getGroupName()});
    return {};
  }
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  return group->allreduce(tensors, options);
}
void wait_for(const c10::intrusive_ptr<c10d::Work>& work) {
  if (work) work->wait();
}

}  // namespace

bool is_traced(const at::Tensor& tensor) {
  return tensor.key_set().has_any(c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::Functionalize}));
}

void all_reduce_sum(at::Tensor& tensor, const GroupPtr& group) {
  if (is_trivial(group)) return;
  wait_for(all_reduce(tensor, group, c10d::ReduceOp::SUM));
}

void all_reduce_max(at::Tensor& tensor, const GroupPtr& group) {
  if (is_trivial(group)) return;
  wait_for(all_reduce(tensor, group, c10d::ReduceOp::MAX));
}

c10::intrusive_ptr<c10d::Work> all_reduce_sum_async(at::Tensor& tensor, const GroupPtr& group) {
  if (is_trivial(group)) return {};
  return all_reduce(tensor, group, c10d::ReduceOp::SUM);
}

c10::intrusive_ptr<c10d::Work> reduce_scatter_sum_async(at::Tensor& tensor, const GroupPtr& group) {
  if (is_trivial(group)) return {};
  const int64_t size = group->getSize();
  TORCH_CHECK(tensor.dim() == 1 && tensor.numel() % size == 0, "reduce_scatter_sum_async: ", tensor.numel(),
              " elements do not split into ", size, " equal pieces");
  if (!has_reduce_scatter(group)) return all_reduce(tensor, group, c10d::ReduceOp::SUM);
  const int64_t piece = tensor.numel() / size;
  at::Tensor mine = tensor.narrow(0, group->getRank() * piece, piece);
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  return group->_reduce_scatter_base(mine, tensor, options);
}

c10::intrusive_ptr<c10d::Work> all_gather_in_place_async(at::Tensor& tensor, const GroupPtr& group) {
  if (is_trivial(group)) return {};
  const int64_t size = group->getSize();
  TORCH_CHECK(tensor.dim() == 1 && tensor.numel() % size == 0, "all_gather_in_place_async: ", tensor.numel(),
              " elements do not split into ", size, " equal pieces");
  const int64_t piece = tensor.numel() / size;
  // In place (the input is the output's own piece): NCCL documents it, gloo copies the piece onto itself.
  at::Tensor mine = tensor.narrow(0, group->getRank() * piece, piece);
  return group->_allgather_base(tensor, mine);
}

bool has_reduce_scatter(const GroupPtr& group) { return group->getBackendName() != "gloo"; }

c10::intrusive_ptr<c10d::Work> all_gather_into_async(at::Tensor& out, const at::Tensor& in, const GroupPtr& group) {
  if (is_traced(in)) {
    out = functional_collective("_c10d_functional::all_gather_into_tensor",
                                {in, static_cast<int64_t>(group->getSize()), group->getGroupName()});
    return {};
  }
  return group->_allgather_base(out, const_cast<at::Tensor&>(in));
}

c10::intrusive_ptr<c10d::Work> reduce_scatter_into_async(at::Tensor& out, const at::Tensor& in,
                                                          const GroupPtr& group) {
  if (is_traced(in)) {
    out = functional_collective("_c10d_functional::reduce_scatter_tensor",
                                {in, std::string("sum"), static_cast<int64_t>(group->getSize()),
                                 group->getGroupName()})
              .view(out.sizes());
    return {};
  }
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  return group->_reduce_scatter_base(out, const_cast<at::Tensor&>(in), options);
}

std::vector<at::Tensor> all_gather(const at::Tensor& tensor, const GroupPtr& group) {
  if (is_trivial(group)) return {tensor};
  if (is_traced(tensor)) {
    return functional_collective("_c10d_functional::all_gather_into_tensor",
                                 {tensor.contiguous(), static_cast<int64_t>(group->getSize()), group->getGroupName()})
        .chunk(group->getSize(), 0);
  }
  std::vector<at::Tensor> inputs{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < group->getSize(); ++i) outputs[0].push_back(at::empty_like(inputs[0]));
  group->allgather(outputs, inputs)->wait();
  return outputs[0];
}

}  // namespace hybrid
