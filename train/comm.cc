#include "train/comm.h"

#include <cstring>

#include "core/error.h"

namespace pt {

InProcessComm::Message& InProcessComm::entry(std::string_view name, int micro_batch, int to) {
  auto it = box_.find(KeyView(micro_batch, to, name));
  if (it == box_.end()) it = box_.emplace(Key(micro_batch, to, std::string(name)), Message()).first;
  return it->second;
}

void InProcessComm::send(std::string_view name, int micro_batch, int from, int to,
                         const void* data, size_t bytes) {
  std::condition_variable* wake = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Message& m = entry(name, micro_batch, to);
    PT_CHECK(!m.full, "message '" + std::string(name) + "' of micro-batch " + std::to_string(micro_batch) +
                          " to device " + std::to_string(to) + " sent twice");
    m.data.resize(bytes);
    if (bytes) std::memcpy(m.data.data(), data, bytes);
    m.from = from;
    m.full = true;
    wake = &arrived_[to];
  }
  wake->notify_all();
}

void InProcessComm::recv(std::string_view name, int micro_batch, int from, int to, void* data,
                         size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  Message& m = entry(name, micro_batch, to);
  arrived_[to].wait(lock, [&] { return m.full || aborted_; });
  if (!m.full) throw CommAborted();
  PT_CHECK(m.from == from && m.data.size() == bytes,
           "message '" + std::string(name) + "' came from device " + std::to_string(m.from) + " with " +
               std::to_string(m.data.size()) + " bytes; expected device " +
               std::to_string(from) + " and " + std::to_string(bytes));
  if (bytes) std::memcpy(data, m.data.data(), bytes);
  m.full = false;
}

void InProcessComm::abort() {
  std::lock_guard<std::mutex> lock(mu_);  // the map may grow under a recv otherwise
  aborted_ = true;
  for (auto& [device, wake] : arrived_) wake.notify_all();
}

void InProcessComm::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = false;
  for (auto& [key, m] : box_) m.full = false;
}

}  // namespace pt
