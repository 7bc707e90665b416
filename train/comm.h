// train/comm.h: how tensors travel between the devices of a pipeline. In: the executor's SEND and
// RECV actions (schedule/lower.h). Out: the bytes, in the receiver's buffer.
//
// Contract (the one lower.h plans with): send() hands the bytes over and returns without waiting
// for the receiver; recv() blocks until the message (name, micro_batch, to) is there, then copies
// it out. A message is sent once and received once. abort() makes every blocked and later recv()
// throw CommAborted, so that one failing device stops the others instead of leaving them waiting;
// reset() clears that state and any undelivered message before the next step.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace pt {

// Thrown by recv() after abort(): the failure is elsewhere, this device just stops.
class CommAborted : public std::runtime_error {
 public:
  CommAborted() : std::runtime_error("communication aborted") {}
};

// One message of a step as its sender sends it: every device's sends, each device's in its action
// order (the order a link from `from` to `to` carries them).
struct PlannedMessage {
  std::string name;
  int micro_batch = 0;
  int from = 0, to = 0;
  size_t bytes = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual void send(std::string_view name, int micro_batch, int from, int to, const void* data,
                    size_t bytes) = 0;
  virtual void recv(std::string_view name, int micro_batch, int from, int to, void* data,
                    size_t bytes) = 0;
  virtual void abort() = 0;
  virtual void reset() = 0;
  // Every message name a step may carry (the executor's plan, the same in every process) and
  // the micro-batch count, before the first step: a Comm between processes numbers its
  // messages from them. The in-process Comms need nothing.
  virtual void plan(const std::vector<std::string>& message_names, int micro_batches) {}
  // Then every message of a step in send order (the executor's plan): a Comm whose links keep
  // their messages in order (NCCL between processes) receives by it.
  virtual void plan_order(const std::vector<PlannedMessage>& sends) {}
};

// Messages on `links` (ordered device pairs) through `routed`, the others through `rest`; plan,
// abort and reset go to both (e.g. NCCL between the GPUs of two ranks, host memory and MPI
// where two ranks share a GPU).
class RoutedComm : public Comm {
 public:
  RoutedComm(std::unique_ptr<Comm> rest, std::unique_ptr<Comm> routed, std::set<std::pair<int, int>> links)
      : rest_(std::move(rest)), routed_(std::move(routed)), links_(std::move(links)) {}
  void send(std::string_view name, int micro_batch, int from, int to, const void* data, size_t bytes) override {
    pick(from, to).send(name, micro_batch, from, to, data, bytes);
  }
  void recv(std::string_view name, int micro_batch, int from, int to, void* data, size_t bytes) override {
    pick(from, to).recv(name, micro_batch, from, to, data, bytes);
  }
  void abort() override {
    rest_->abort();
    routed_->abort();
  }
  void reset() override {
    rest_->reset();
    routed_->reset();
  }
  void plan(const std::vector<std::string>& message_names, int micro_batches) override {
    rest_->plan(message_names, micro_batches);
    routed_->plan(message_names, micro_batches);
  }
  void plan_order(const std::vector<PlannedMessage>& sends) override {
    rest_->plan_order(sends);
    routed_->plan_order(sends);
  }

 private:
  Comm& pick(int from, int to) { return links_.count({from, to}) ? *routed_ : *rest_; }
  std::unique_ptr<Comm> rest_, routed_;
  std::set<std::pair<int, int>> links_;
};

// Devices as threads of one process: a mailbox keyed by (name, micro_batch, to) under one mutex.
// Mailbox entries and their byte buffers stay allocated once used, so from the second step on
// send and recv allocate nothing. A send wakes only its receiving device's thread: with one wake-up
// for all, every send woke every waiting device, which on shared cores preempted the device at
// work and left its caches colder for nothing.
class InProcessComm : public Comm {
 public:
  void send(std::string_view name, int micro_batch, int from, int to, const void* data,
            size_t bytes) override;
  void recv(std::string_view name, int micro_batch, int from, int to, void* data,
            size_t bytes) override;
  void abort() override;
  void reset() override;

 private:
  struct Message {
    bool full = false;
    int from = -1;
    std::vector<std::byte> data;
  };
  // (micro_batch, to, name); KeyLess finds by a string_view name without a copy (std::less<>
  // would compare tuples of string and string_view, which only some standard libraries allow).
  using Key = std::tuple<int, int, std::string>;
  using KeyView = std::tuple<int, int, std::string_view>;
  struct KeyLess {
    using is_transparent = void;
    static KeyView view(const Key& k) { return {std::get<0>(k), std::get<1>(k), std::get<2>(k)}; }
    static const KeyView& view(const KeyView& k) { return k; }
    template <class A, class B>
    bool operator()(const A& a, const B& b) const { return view(a) < view(b); }
  };
  Message& entry(std::string_view name, int micro_batch, int to);  // caller holds mu_

  std::mutex mu_;
  std::map<int, std::condition_variable> arrived_;  // per receiving device; under mu_
  std::map<Key, Message, KeyLess> box_;
  bool aborted_ = false;
};

}  // namespace pt
