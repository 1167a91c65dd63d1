/* wavelet-bench's reference models (MLP, CNN, residual CNN) on the kernels' layer API, with
 * activations allocated as the layers run and freed in backward. */
#ifndef WB_NET_H
#define WB_NET_H

#include "backend.h"
#include "data.h"

#include <wavelet/kernels.h>

typedef enum wb_model_e { WB_MLP = 0, WB_CNN = 1, WB_RESNET = 2 } wb_model_t;
typedef enum wb_opt_e { WB_ADAM = 0, WB_SGD = 1 } wb_opt_t;
typedef enum wb_layer_kind_e { WB_L_LINEAR, WB_L_CONV, WB_L_POOL, WB_L_RES } wb_layer_kind_t;

/* Where a step is, for the markers: before the forward pass, at the memory peak (early in
 * backward, where the replica's holding first falls), and after the optimizer step. */
typedef enum wb_mark_e {
  WB_MARK_BEGIN = 1,
  WB_MARK_BACKWARD = 2,
  WB_MARK_END = 3,
  WB_MARK_EVAL_BEGIN = 4, /* around each evaluation batch: it rises too, so it is gated */
  WB_MARK_EVAL_END = 5
} wb_mark_t;

#define WB_MAX_LAYERS 24

typedef struct wb_layer_s {
  wb_layer_kind_t kind;
  char name[16];
  int relu;
  size_t in_ps, out_ps; /* elements per sample in and out */
  wl_conv2d_t cv, cv2;  /* CONV: cv; RES: both (same shape) */
  wl_pool2d_t pl;
  size_t in_f, out_f;  /* LINEAR */
  size_t w, b, w2, b2; /* parameter offsets (floats) */
  size_t fan_in;
  float *y, *h; /* the output and (RES) the inner activation, live from forward to backward */
} wb_layer_t;

typedef struct wb_net_s {
  wb_backend_t *be;
  wb_model_t model;
  int nl;
  wb_layer_t l[WB_MAX_LAYERS];
  size_t nparam;        /* floats, with alignment padding */
  float *w, *g, *m, *v; /* parameters, gradients, optimizer state (m: SGD velocity) */
  size_t max_batch;
  size_t gb_ps; /* backward's gradient buffers: ngb of gb_ps floats a sample */
  int ngb;
  float *gb[3];
  wb_opt_t opt;
  wl_sgd_t sgd;
  wl_adam_t adam;
  long step;
  float lr0, lr_scale; /* the optimizer's rate is lr0 * lr_scale (a schedule sets the scale) */
  float *hx;           /* host staging of one batch */
  int32_t *hy;
  float *x; /* this step's input and labels, live from begin to end */
  int32_t *y;
  int past_peak;                        /* this step's memory has started to fall (marked) */
  void (*mark)(void *arg, wb_mark_t m); /* may be NULL */
  void *mark_arg;
  /* Data parallelism: called with the gradients (nparam floats, a tensor of the backend) after
   * backward, before the optimizer step, in the falling phase of the step; 0 or a negative
   * errno (where is set to "gradient all-reduce"). May be NULL. */
  int (*reduce)(void *arg, float *g, size_t n);
  void *reduce_arg;
  char where[48]; /* what was running when the last step failed ("forward of conv2") */
} wb_net_t;

const char *wb_model_name(wb_model_t m);

/* Builds the model for batches up to max_batch, initialises the parameters from seed (He
 * uniform) and allocates parameters, gradients and optimizer state from the backend.
 * 0, or a negative errno with one line in be->why. */
int wb_net_create(wb_net_t **out, wb_backend_t *be, wb_model_t model, size_t max_batch,
                  wb_opt_t opt, float lr, uint64_t seed);
void wb_net_destroy(wb_net_t *n);

/* Floats of the parameter block (with padding) of a model, without building it. */
size_t wb_net_param_floats(wb_model_t model);

/* A 64-bit FNV-1a hash of the parameter block's bytes: ranks that stayed in step agree. 0 or a
 * negative errno. */
int wb_net_checksum(wb_net_t *n, uint64_t *sum);
/* Writes the parameter block (nparam floats) to path. 0 or a negative errno. */
int wb_net_save(wb_net_t *n, const char *path);

/* Number of real parameters (without padding). */
size_t wb_net_param_count(const wb_net_t *n);

/* One training step on the samples idx[0..bs) of s: forward (activations allocated as each
 * layer runs), loss, backward (each activation freed once its gradient is through), and the
 * optimizer update when update != 0. Calls the marks. *loss: the batch's mean loss; *correct is
 * increased by the batch's correct predictions. -ENOMEM when memory could not be had (be->why and
 * where say why and where); everything the step allocated is freed again. */
int wb_net_step(wb_net_t *n, const wb_split_t *s, const uint32_t *idx, size_t bs, int update,
                float *loss, size_t *correct);

/* Accuracy and mean loss over the first `count` samples of s (forward only, freeing each
 * activation as soon as the next layer has read it). */
int wb_net_eval(wb_net_t *n, const wb_split_t *s, size_t count, size_t batch, double *acc,
                double *loss);

#endif
