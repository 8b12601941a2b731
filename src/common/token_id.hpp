// The one integer type of a token id, shared by the tokenizer, the engine and the pool.
#pragma once

#include <cstdint>

namespace swarm {

using TokenId = std::int32_t;

}  // namespace swarm
