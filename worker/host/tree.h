// Binary trees over the ranks for the double binary tree AllReduce (pure logic, unit-tested).
#pragma once

namespace ina::host {

struct TreeLinks {
  int parent = -1;          // -1: the root
  int child[2] = {-1, -1};  // -1: none
};

// NCCL's in-order binary tree (ncclGetBtree): rank 0 is the root with one child, the largest
// power of two below the world size; odd ranks are leaves, and a rank with lowest set bit b has
// children rank - b/2 and rank + b/2 (the latter moved down while out of range).
TreeLinks btree(int size, int rank);

// NCCL's double binary tree (ncclGetDtree): tree 0 is btree; tree 1 is its mirror
// (rank -> size-1-rank) for an even size, or btree shifted by one rank for an odd size. Each
// rank is a leaf in at least one of the two trees, so the two trees together use every rank's
// links about evenly.
TreeLinks dtree(int size, int rank, int which);

}  // namespace ina::host
