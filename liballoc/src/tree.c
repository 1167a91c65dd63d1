/* The size tree: an intrusive treap of free blocks keyed by (size, address), for best fit, with
 * parent links: a block is removed where it is, without a search. */
#include "internal.h"

#include <errno.h>

/* Why a treap: the trees hold a few dozen blocks (12 on average on wl-bench-alloc's DNN trace,
 * 130 on its random one), where an AVL tree's upward rebalancing, run after every insert and
 * removal, cost more than the search: about 23 % of liballoc's instructions on the DNN trace.
 * A treap keeps a heap order on a priority hashed from the block's address, so the expected
 * depth stays logarithmic with fewer than two rotations per insert or removal and nothing to
 * recompute on the way up. The shape never changes which block a search returns: that is fixed
 * by the key order alone. */

static int key_less(const wl__block_t *a, const wl__block_t *b) {
  return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

/* Drawn when a block is filed; a block that takes another's place (wl__tree_replace) takes its
 * priority too. */
static uint32_t draw_prio(uintptr_t addr) {
  return (uint32_t)(((uint64_t)(addr >> 8) * 0x9E3779B97F4A7C15ull) >> 32);
}

/* Puts n where old was under parent (the root when parent is NULL). */
static void replace_child(wl__block_t **root, wl__block_t *parent, wl__block_t *old,
                          wl__block_t *n) {
  if (!parent)
    *root = n;
  else if (parent->left == old)
    parent->left = n;
  else
    parent->right = n;
  if (n) n->parent = parent;
}

/* Lifts n's left child l above n. */
static void rot_right(wl__block_t **root, wl__block_t *n) {
  wl__block_t *l = n->left;
  n->left = l->right;
  if (l->right) l->right->parent = n;
  replace_child(root, n->parent, n, l);
  l->right = n;
  n->parent = l;
}

static void rot_left(wl__block_t **root, wl__block_t *n) {
  wl__block_t *r = n->right;
  n->right = r->left;
  if (r->left) r->left->parent = n;
  replace_child(root, n->parent, n, r);
  r->left = n;
  n->parent = r;
}

void wl__tree_insert(wl__block_t **root, wl__block_t *b) {
  b->left = b->right = NULL;
  b->prio = draw_prio(b->addr);
  wl__block_t *p = NULL, **link = root;
  while (*link) {
    p = *link;
    link = key_less(b, p) ? &p->left : &p->right;
  }
  *link = b;
  b->parent = p;
  /* Up while the heap order is broken; the key order holds throughout. */
  while (b->parent && b->parent->prio < b->prio) {
    if (b->parent->left == b)
      rot_right(root, b->parent);
    else
      rot_left(root, b->parent);
  }
}

void wl__tree_remove(wl__block_t **root, wl__block_t *b) {
  /* Down, past the child with the higher priority, until b has at most one child. */
  while (b->left && b->right) {
    if (b->left->prio > b->right->prio)
      rot_right(root, b);
    else
      rot_left(root, b);
  }
  replace_child(root, b->parent, b, b->left ? b->left : b->right);
  b->left = b->right = b->parent = NULL;
}

void wl__tree_replace(wl__block_t **root, wl__block_t *old, wl__block_t *b) {
  b->left = old->left;
  b->right = old->right;
  b->prio = old->prio;
  if (b->left) b->left->parent = b;
  if (b->right) b->right->parent = b;
  replace_child(root, old->parent, old, b);
  old->left = old->right = old->parent = NULL;
}

wl__block_t *wl__tree_prev(wl__block_t *n) {
  if (n->left) {
    for (n = n->left; n->right;) n = n->right;
    return n;
  }
  while (n->parent && n->parent->left == n) n = n->parent;
  return n->parent;
}

wl__block_t *wl__tree_next(wl__block_t *n) {
  if (n->right) {
    for (n = n->right; n->left;) n = n->left;
    return n;
  }
  while (n->parent && n->parent->right == n) n = n->parent;
  return n->parent;
}

wl__block_t *wl__tree_lower_bound(wl__block_t *n, size_t size) {
  wl__block_t *best = NULL;
  while (n) {
    if (n->size >= size) {
      best = n;
      n = n->left;
    } else {
      n = n->right;
    }
  }
  return best;
}

wl__block_t *wl__tree_max(wl__block_t *n) {
  while (n && n->right) n = n->right;
  return n;
}

size_t wl__tree_count(const wl__block_t *n) {
  return n ? 1 + wl__tree_count(n->left) + wl__tree_count(n->right) : 0;
}

static int check(const wl__block_t *n, const wl__block_t *lo, const wl__block_t *hi) {
  if (!n) return 0;
  if ((n->left && n->left->parent != n) || (n->right && n->right->parent != n)) return -EFAULT;
  if (lo && !key_less(lo, n)) return -EFAULT;
  if (hi && !key_less(n, hi)) return -EFAULT;
  if (n->left && n->left->prio > n->prio) return -EFAULT;
  if (n->right && n->right->prio > n->prio) return -EFAULT;
  if (check(n->left, lo, n) || check(n->right, n, hi)) return -EFAULT;
  return 0;
}

int wl__tree_check(const wl__block_t *root) {
  if (root && root->parent) return -EFAULT;
  return check(root, NULL, NULL);
}
