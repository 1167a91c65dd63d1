/* The size tree: an intrusive AVL tree of free blocks keyed by (size, address), for best fit. */
#include "internal.h"

#include <errno.h>

static int key_less(const wl__block_t *a, const wl__block_t *b) {
  return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

static int32_t h(const wl__block_t *n) {
  return n ? n->height : 0;
}

static void fix(wl__block_t *n) {
  int32_t l = h(n->left), r = h(n->right);
  n->height = (l > r ? l : r) + 1;
}

static wl__block_t *rot_right(wl__block_t *n) {
  wl__block_t *l = n->left;
  n->left = l->right;
  l->right = n;
  fix(n);
  fix(l);
  return l;
}

static wl__block_t *rot_left(wl__block_t *n) {
  wl__block_t *r = n->right;
  n->right = r->left;
  r->left = n;
  fix(n);
  fix(r);
  return r;
}

static wl__block_t *balance(wl__block_t *n) {
  fix(n);
  int32_t bf = h(n->left) - h(n->right);
  if (bf > 1) {
    if (h(n->left->left) < h(n->left->right)) n->left = rot_left(n->left);
    return rot_right(n);
  }
  if (bf < -1) {
    if (h(n->right->right) < h(n->right->left)) n->right = rot_right(n->right);
    return rot_left(n);
  }
  return n;
}

static wl__block_t *tree_add(wl__block_t *n, wl__block_t *b) {
  if (!n) return b;
  if (key_less(b, n))
    n->left = tree_add(n->left, b);
  else
    n->right = tree_add(n->right, b);
  return balance(n);
}

void wl__tree_insert(wl__block_t **root, wl__block_t *b) {
  b->left = b->right = NULL;
  b->height = 1;
  *root = tree_add(*root, b);
}

/* Detaches the minimum of subtree n into *min; returns the rest. */
static wl__block_t *remove_min(wl__block_t *n, wl__block_t **min) {
  if (!n->left) {
    *min = n;
    return n->right;
  }
  n->left = remove_min(n->left, min);
  return balance(n);
}

static wl__block_t *tree_del(wl__block_t *n, wl__block_t *b) {
  if (!n) return NULL; /* not present: the caller's invariant check will say so */
  if (n == b) {
    if (!n->left) return n->right;
    if (!n->right) return n->left;
    wl__block_t *m;
    wl__block_t *rest = remove_min(n->right, &m);
    m->left = n->left;
    m->right = rest;
    return balance(m);
  }
  if (key_less(b, n))
    n->left = tree_del(n->left, b);
  else
    n->right = tree_del(n->right, b);
  return balance(n);
}

void wl__tree_remove(wl__block_t **root, wl__block_t *b) {
  *root = tree_del(*root, b);
  b->left = b->right = NULL;
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
  if (lo && !key_less(lo, n)) return -EFAULT;
  if (hi && !key_less(n, hi)) return -EFAULT;
  int32_t l = h(n->left), r = h(n->right);
  if (n->height != (l > r ? l : r) + 1 || l - r > 1 || r - l > 1) return -EFAULT;
  if (check(n->left, lo, n) || check(n->right, n, hi)) return -EFAULT;
  return 0;
}

int wl__tree_check(const wl__block_t *root) {
  return check(root, NULL, NULL);
}
