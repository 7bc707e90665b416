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
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace pt {

// Thrown by recv() after abort(): the failure is elsewhere, this device just stops.
class CommAborted : public std::runtime_error {
 public:
  CommAborted() : std::runtime_error("communication aborted") {}
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
};

// Devices as threads of one process: a mailbox keyed by (name, micro_batch, to) under one mutex.
// Mailbox entries and their byte buffers stay allocated once used, so from the second step on
// send and recv allocate nothing.
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
  // (micro_batch, to, name); std::less<> finds by a string_view name without a copy.
  using Key = std::tuple<int, int, std::string>;
  Message& entry(std::string_view name, int micro_batch, int to);  // caller holds mu_

  std::mutex mu_;
  std::condition_variable arrived_;
  std::map<Key, Message, std::less<>> box_;
  bool aborted_ = false;
};

}  // namespace pt
