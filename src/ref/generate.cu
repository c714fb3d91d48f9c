#include <cstdio>
#include <span>
__global__ void k(std::span<int> s){} 
