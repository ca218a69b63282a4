// The wheel ships libexecutorch_threadpool.so but not extension/threadpool/threadpool.h, so the two
// entry points used here are declared by hand. They match the exported symbols (`nm -DC`):
//   executorch::extension::threadpool::get_threadpool()
//   executorch::extension::threadpool::ThreadPool::get_thread_count() const
//   executorch::extension::threadpool::ThreadPool::_unsafe_reset_threadpool(unsigned int)
// The class is only ever used through the pointer the library returns, and the declaration mirrors
// the upstream one (same members), so layout and mangled names agree.
#include "threadpool_control.h"

#include <cstdint>
#include <memory>
#include <mutex>

extern "C" {
struct pthreadpool;
void pthreadpool_destroy(struct pthreadpool* threadpool);
}

namespace executorch::extension::threadpool {

class ThreadPool final {
 public:
  size_t get_thread_count() const;
  bool _unsafe_reset_threadpool(uint32_t num_threads);

 private:
  mutable std::mutex mutex_;
  std::unique_ptr<pthreadpool, decltype(&pthreadpool_destroy)> threadpool_;
};

ThreadPool* get_threadpool();

}  // namespace executorch::extension::threadpool

namespace etlab {

size_t set_thread_count(size_t threads) {
  auto* pool = ::executorch::extension::threadpool::get_threadpool();
  if (pool == nullptr) return 0;
  if (threads > 0) pool->_unsafe_reset_threadpool(static_cast<uint32_t>(threads));
  return pool->get_thread_count();
}

}  // namespace etlab
