#include <cstdio>
int main() { std::puts("swarm-model: not built yet"); return 1; }
