#include "comm/collectives.h"

#include <vector>

namespace hybrid {

namespace {
c10::intrusive_ptr<c10d::Work> all_reduce(at::Tensor& tensor, const GroupPtr& group, c10d::ReduceOp op) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  return group->allreduce(tensors, options);
}
}  // namespace

void all_reduce_sum(at::Tensor& tensor, const GroupPtr& group) {
  if (is_trivial(group)) return;
  all_reduce(tensor, group, c10d::ReduceOp::SUM)->wait();
}

void all_reduce_max(at::Tensor& tensor, const GroupPtr& group) {
  if (is_trivial(group)) return;
  all_reduce(tensor, group, c10d::ReduceOp::MAX)->wait();
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

std::vector<at::Tensor> all_gather(const at::Tensor& tensor, const GroupPtr& group) {
  if (is_trivial(group)) return {tensor};
  std::vector<at::Tensor> inputs{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < group->getSize(); ++i) outputs[0].push_back(at::empty_like(inputs[0]));
  group->allgather(outputs, inputs)->wait();
  return outputs[0];
}

}  // namespace hybrid
