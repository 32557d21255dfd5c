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

}  // namespace hybrid
