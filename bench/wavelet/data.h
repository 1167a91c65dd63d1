/* wavelet-bench's data: Fashion-MNIST from idx files (plain or gzip), or synthetic images. */
#ifndef WB_DATA_H
#define WB_DATA_H

#include <stddef.h>
#include <stdint.h>

/* Where the Debian package dataset-fashion-mnist puts the files. */
#define WB_DATA_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#define WB_IMG_ROWS         28
#define WB_IMG_COLS         28
#define WB_IMG_PIXELS       (WB_IMG_ROWS * WB_IMG_COLS)
#define WB_CLASSES          10
/* More items than this in one file is taken for a corrupt header (Fashion-MNIST has 60000). */
#define WB_IDX_MAX_ITEMS 10000000u

/* n images of 28 x 28 bytes (row-major) and their labels 0..9. */
typedef struct wb_split_s {
  size_t n;
  uint8_t *images;
  uint8_t *labels;
} wb_split_t;

typedef struct wb_data_s {
  wb_split_t train, test;
  char source[256]; /* the directory, or "synthetic" */
} wb_data_t;

/* Reads one idx file (gzip, told by its magic, or plain; a gzip file must be whole gzip members
 * to its end). kind 3: images (magic 0x00000803, dims n x 28 x 28), kind 1: labels (magic
 * 0x00000801, dims n, every value < 10). On success *items holds the item count and *out a
 * malloc'ed buffer of n * item bytes. On failure returns a negative errno and err holds one line:
 * the file and what was expected. */
int wb_idx_read(const char *path, int kind, size_t *items, uint8_t **out, char *err, size_t errlen);

/* Loads DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] and checks that images and labels
 * agree in number. 0, or a negative errno with one line in err. */
int wb_data_load(const char *dir, wb_data_t *d, char *err, size_t errlen);

/* Deterministic synthetic images (a class-dependent pattern plus noise), for runs without the
 * data set; only with an explicit --data synthetic. */
int wb_data_synthetic(wb_data_t *d, size_t n_train, size_t n_test, uint64_t seed);

/* Keeps the first n_train / n_test items (0: all). */
void wb_data_limit(wb_data_t *d, size_t n_train, size_t n_test);

void wb_data_free(wb_data_t *d);

#endif
