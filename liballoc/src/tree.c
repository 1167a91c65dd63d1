/* The size tree: an intrusive AVL tree of free blocks keyed by (size, address), for best fit,
 * with parent links: a block is removed where it is, without a search. */
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

static wl__block_t *rot_right(wl__block_t **root, wl__block_t *n) {
  wl__block_t *l = n->left;
  n->left = l->right;
  if (l->right) l->right->parent = n;
  replace_child(root, n->parent, n, l);
  l->right = n;
  n->parent = l;
  fix(n);
  fix(l);
  return l;
}

static wl__block_t *rot_left(wl__block_t **root, wl__block_t *n) {
  wl__block_t *r = n->right;
  n->right = r->left;
  if (r->left) r->left->parent = n;
  replace_child(root, n->parent, n, r);
  r->left = n;
  n->parent = r;
  fix(n);
  fix(r);
  return r;
}

/* Rebalances from n (whose subtree just changed) towards the root, and stops where a subtree
 * comes out as high as it was: nothing above it can change. An insert stops after at most one
 * rotation, a removal usually within a level or two. (The recursive form rebalanced every
 * level of the path and searched for the node to remove: about 45 % of liballoc's instructions
 * on wl-bench-alloc's DNN trace.) */
static void retrace(wl__block_t **root, wl__block_t *n) {
  while (n) {
    wl__block_t *up = n->parent, *top = n;
    int32_t was = n->height, l = h(n->left), r = h(n->right);
    if (l - r > 1) {
      if (h(n->left->left) < h(n->left->right)) rot_left(root, n->left);
      top = rot_right(root, n);
    } else if (r - l > 1) {
      if (h(n->right->right) < h(n->right->left)) rot_right(root, n->right);
      top = rot_left(root, n);
    } else {
      n->height = (l > r ? l : r) + 1;
    }
    if (top->height == was) return;
    n = up;
  }
}

void wl__tree_insert(wl__block_t **root, wl__block_t *b) {
  b->left = b->right = NULL;
  b->height = 1;
  wl__block_t *p = NULL, **link = root;
  while (*link) {
    p = *link;
    link = key_less(b, p) ? &p->left : &p->right;
  }
  *link = b;
  b->parent = p;
  retrace(root, p);
}

void wl__tree_remove(wl__block_t **root, wl__block_t *b) {
  wl__block_t *from;
  if (b->left && b->right) {
    /* b's successor m (no left child) takes b's place, height included; the rebalancing starts
     * where m was taken out. */
    wl__block_t *m = b->right;
    while (m->left) m = m->left;
    if (m->parent == b) {
      from = m;
    } else {
      from = m->parent;
      replace_child(root, m->parent, m, m->right);
      m->right = b->right;
      b->right->parent = m;
    }
    m->left = b->left;
    b->left->parent = m;
    replace_child(root, b->parent, b, m);
    m->height = b->height;
  } else {
    from = b->parent;
    replace_child(root, b->parent, b, b->left ? b->left : b->right);
  }
  retrace(root, from);
  b->left = b->right = b->parent = NULL;
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
  int32_t l = h(n->left), r = h(n->right);
  if (n->height != (l > r ? l : r) + 1 || l - r > 1 || r - l > 1) return -EFAULT;
  if (check(n->left, lo, n) || check(n->right, n, hi)) return -EFAULT;
  return 0;
}

int wl__tree_check(const wl__block_t *root) {
  if (root && root->parent) return -EFAULT;
  return check(root, NULL, NULL);
}
