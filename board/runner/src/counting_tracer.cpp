#include "counting_tracer.h"

#include <cstring>

namespace etlab {

namespace et = ::executorch::runtime;

CountingTracer::CountingTracer(::executorch::etdump::ETDumpGen& inner, const CounterGroup& group)
    : inner_(inner), group_(group) {}

void CountingTracer::sync() {
  inner_.set_chain_debug_handle(chain_id_, debug_handle_);
  inner_.set_bundled_input_index(bundled_input_index_);
  inner_.set_event_tracer_debug_level(event_tracer_debug_level_);
  inner_.set_event_tracer_profiling_level(event_tracer_profiling_level_);
}

void CountingTracer::create_event_block(const char* name) {
  sync();
  inner_.create_event_block(name);
  in_execute_ = std::strcmp(name, "Execute") == 0;
  profile_events_ = 0;
  open_.clear();
  if (in_execute_) executions_.emplace_back();
}

et::EventTracerEntry CountingTracer::start_profiling(const char* name, et::ChainID chain_id,
                                                     et::DebugHandle debug_handle) {
  sync();
  const auto entry = inner_.start_profiling(name, chain_id, debug_handle);
  const bool instruction = std::strcmp(name, "OPERATOR_CALL") == 0 || std::strcmp(name, "DELEGATE_CALL") == 0;
  if (in_execute_ && instruction && entry.chain_id >= 0) {
    Open open{entry.event_id, entry.start_time, {}};
    if (group_.read(open.start)) open_.push_back(std::move(open));
    else ++failed_reads_;
  }
  return entry;
}

void CountingTracer::end_profiling(et::EventTracerEntry entry) {
  if (!open_.empty() && open_.back().event_id == entry.event_id && open_.back().start_time == entry.start_time) {
    const bool read_ok = group_.read(scratch_);
    Open open = std::move(open_.back());
    open_.pop_back();
    if (read_ok) {
      const size_t n = group_.captured().size();
      const double enabled = static_cast<double>(scratch_[n] - open.start[n]);
      const double running = static_cast<double>(scratch_[n + 1] - open.start[n + 1]);
      const double ratio = enabled > 0 ? running / enabled : 1.0;
      if (ratio < min_running_ratio_) min_running_ratio_ = ratio;
      CounterSample sample{profile_events_, static_cast<int64_t>(entry.chain_id),
                           static_cast<int64_t>(entry.debug_handle), std::vector<uint64_t>(n)};
      for (size_t i = 0; i < n; ++i) {
        const uint64_t delta = scratch_[i] - open.start[i];
        // Multiplexed: extrapolate to the whole interval, as perf stat does.
        sample.deltas[i] = ratio > 0 && ratio < 1.0 ? static_cast<uint64_t>(delta / ratio) : delta;
      }
      if (!executions_.empty()) executions_.back().push_back(std::move(sample));
    } else {
      ++failed_reads_;
    }
  }
  sync();
  inner_.end_profiling(entry);
  ++profile_events_;
}

et::EventTracerEntry CountingTracer::start_profiling_delegate(const char* name, et::DelegateDebugIntId index) {
  sync();
  return inner_.start_profiling_delegate(name, index);
}

void CountingTracer::end_profiling_delegate(et::EventTracerEntry entry, const void* metadata, size_t metadata_len) {
  sync();
  inner_.end_profiling_delegate(entry, metadata, metadata_len);
  ++profile_events_;
}

void CountingTracer::log_profiling_delegate(const char* name, et::DelegateDebugIntId index, et_timestamp_t start_time,
                                            et_timestamp_t end_time, const void* metadata, size_t metadata_len) {
  sync();
  inner_.log_profiling_delegate(name, index, start_time, end_time, metadata, metadata_len);
  ++profile_events_;
}

void CountingTracer::track_allocation(et::AllocatorID id, size_t size) {
  sync();
  inner_.track_allocation(id, size);
}

et::AllocatorID CountingTracer::track_allocator(const char* name) {
  sync();
  return inner_.track_allocator(name);
}

et::Result<bool> CountingTracer::log_evalue(const et::EValue& evalue, et::LoggedEValueType type) {
  sync();
  return inner_.log_evalue(evalue, type);
}

et::Result<bool> CountingTracer::log_intermediate_output_delegate(const char* name, et::DelegateDebugIntId index,
                                                                  const ::executorch::aten::Tensor& output) {
  sync();
  return inner_.log_intermediate_output_delegate(name, index, output);
}

et::Result<bool> CountingTracer::log_intermediate_output_delegate(
    const char* name, et::DelegateDebugIntId index, const et::ArrayRef<::executorch::aten::Tensor> output) {
  sync();
  return inner_.log_intermediate_output_delegate(name, index, output);
}

et::Result<bool> CountingTracer::log_intermediate_output_delegate(const char* name, et::DelegateDebugIntId index,
                                                                  const int& output) {
  sync();
  return inner_.log_intermediate_output_delegate(name, index, output);
}

et::Result<bool> CountingTracer::log_intermediate_output_delegate(const char* name, et::DelegateDebugIntId index,
                                                                  const bool& output) {
  sync();
  return inner_.log_intermediate_output_delegate(name, index, output);
}

et::Result<bool> CountingTracer::log_intermediate_output_delegate(const char* name, et::DelegateDebugIntId index,
                                                                  const double& output) {
  sync();
  return inner_.log_intermediate_output_delegate(name, index, output);
}

void CountingTracer::set_delegation_intermediate_output_filter(et::EventTracerFilterBase* filter) {
  inner_.set_delegation_intermediate_output_filter(filter);
}

}  // namespace etlab
