// An EventTracer that forwards every call to an ETDumpGen (so the ETDump stays what Inspector reads) and reads a
// counter group at the start and end of each profiled instruction: every kernel call and every delegate call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <executorch/devtools/etdump/etdump_flatcc.h>
#include <executorch/runtime/core/event_tracer.h>

#include "perf_counters.h"

namespace etlab {

// One profiled instruction of one execution: where its ETDump event sits and what the counters moved by.
struct CounterSample {
  int64_t event_index;  // index among the profile events of its "Execute" block, as the ETDump orders them
  int64_t chain;
  int64_t instruction;
  std::vector<uint64_t> deltas;  // per captured counter, scaled when the group was multiplexed
};

class CountingTracer final : public ::executorch::runtime::EventTracer {
 public:
  CountingTracer(::executorch::etdump::ETDumpGen& inner, const CounterGroup& group);

  void create_event_block(const char* name) override;
  ::executorch::runtime::EventTracerEntry start_profiling(
      const char* name, ::executorch::runtime::ChainID chain_id,
      ::executorch::runtime::DebugHandle debug_handle) override;
  void end_profiling(::executorch::runtime::EventTracerEntry entry) override;
  ::executorch::runtime::EventTracerEntry start_profiling_delegate(
      const char* name, ::executorch::runtime::DelegateDebugIntId index) override;
  void end_profiling_delegate(::executorch::runtime::EventTracerEntry entry, const void* metadata,
                              size_t metadata_len) override;
  void log_profiling_delegate(const char* name, ::executorch::runtime::DelegateDebugIntId index,
                              et_timestamp_t start_time, et_timestamp_t end_time, const void* metadata,
                              size_t metadata_len) override;
  void track_allocation(::executorch::runtime::AllocatorID id, size_t size) override;
  ::executorch::runtime::AllocatorID track_allocator(const char* name) override;
  ::executorch::runtime::Result<bool> log_evalue(const ::executorch::runtime::EValue& evalue,
                                                 ::executorch::runtime::LoggedEValueType type) override;
  ::executorch::runtime::Result<bool> log_intermediate_output_delegate(
      const char* name, ::executorch::runtime::DelegateDebugIntId index,
      const ::executorch::aten::Tensor& output) override;
  ::executorch::runtime::Result<bool> log_intermediate_output_delegate(
      const char* name, ::executorch::runtime::DelegateDebugIntId index,
      const ::executorch::runtime::ArrayRef<::executorch::aten::Tensor> output) override;
  ::executorch::runtime::Result<bool> log_intermediate_output_delegate(
      const char* name, ::executorch::runtime::DelegateDebugIntId index, const int& output) override;
  ::executorch::runtime::Result<bool> log_intermediate_output_delegate(
      const char* name, ::executorch::runtime::DelegateDebugIntId index, const bool& output) override;
  ::executorch::runtime::Result<bool> log_intermediate_output_delegate(
      const char* name, ::executorch::runtime::DelegateDebugIntId index, const double& output) override;
  void set_delegation_intermediate_output_filter(
      ::executorch::runtime::EventTracerFilterBase* filter) override;

  // Per "Execute" block, in order (warmup included).
  const std::vector<std::vector<CounterSample>>& executions() const { return executions_; }
  // The smallest time_running / time_enabled seen: below 1 the kernel multiplexed the group.
  double min_running_ratio() const { return min_running_ratio_; }
  uint64_t failed_reads() const { return failed_reads_; }

 private:
  struct Open {
    int64_t event_id;
    et_timestamp_t start_time;
    std::vector<uint64_t> start;
  };
  void sync();  // the ids and levels Method sets on this object are what the ETDumpGen must see

  ::executorch::etdump::ETDumpGen& inner_;
  const CounterGroup& group_;
  bool in_execute_ = false;
  int64_t profile_events_ = 0;
  std::vector<Open> open_;
  std::vector<uint64_t> scratch_;
  std::vector<std::vector<CounterSample>> executions_;
  double min_running_ratio_ = 1.0;
  uint64_t failed_reads_ = 0;
};

}  // namespace etlab
