// Placeholder until the model I/O library lands.
namespace swarm {}  // namespace swarm
