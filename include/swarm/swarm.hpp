// Umbrella header of the swarm client SDK: everything an agent program needs.
//
//   swarm::SwarmClient client("http://127.0.0.1:10086");
//   auto ep = client.begin_episode();
//   swarm::OpenAIClient llm(ep);
//   auto reply = llm.chat(nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}}));
//   swarm::WorkflowOutput out;
//   out.reward = 1.0;
//   client.end_episode(task, ep.episode_uuid, out);
#pragma once

#include "swarm/client.hpp"
#include "swarm/errors.hpp"
#include "swarm/job.hpp"
#include "swarm/openai.hpp"
#include "swarm/types.hpp"
