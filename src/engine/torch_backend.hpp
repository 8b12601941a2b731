// The torch backend: a Hugging Face model served by the in-process ServingEngine (continuous
// batching over a paged KV cache). Only built with libtorch; the header itself needs no torch.
#pragma once

#include <memory>

#include "engine/backend.hpp"

namespace swarm {

/// A new, unbooted torch backend.
std::unique_ptr<Backend> make_torch_backend();
/// Registers "torch" with make_backend (call once at start-up in programs that link swarm_torch).
void register_torch_backend();

}  // namespace swarm
