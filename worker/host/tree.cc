#include "worker/host/tree.h"

namespace ina::host {

TreeLinks btree(int size, int rank) {
  TreeLinks l;
  int bit = 1;
  while (bit < size && !(bit & rank)) bit <<= 1;
  if (rank == 0) {
    l.child[1] = size > 1 ? bit >> 1 : -1;
    return l;
  }
  int up = (rank ^ bit) | (bit << 1);
  if (up >= size) up = rank ^ bit;
  l.parent = up;
  int low = bit >> 1;
  l.child[0] = low == 0 ? -1 : rank - low;
  int down1 = low == 0 ? -1 : rank + low;
  while (down1 >= size) {
    low >>= 1;
    down1 = low == 0 ? -1 : rank + low;
  }
  l.child[1] = down1;
  return l;
}

TreeLinks dtree(int size, int rank, int which) {
  if (which == 0) return btree(size, rank);
  TreeLinks l;
  if (size % 2 == 1) {
    const TreeLinks s = btree(size, (rank - 1 + size) % size);
    auto map = [size](int x) { return x < 0 ? -1 : (x + 1) % size; };
    l.parent = map(s.parent);
    l.child[0] = map(s.child[0]);
    l.child[1] = map(s.child[1]);
  } else {
    const TreeLinks m = btree(size, size - 1 - rank);
    auto map = [size](int x) { return x < 0 ? -1 : size - 1 - x; };
    l.parent = map(m.parent);
    l.child[0] = map(m.child[0]);
    l.child[1] = map(m.child[1]);
  }
  return l;
}

}  // namespace ina::host
