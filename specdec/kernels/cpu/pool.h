/* The CPU kernels' threads (pool.c): items of one call shared out by work stealing. */
#ifndef SPECDEC_POOL_H
#define SPECDEC_POOL_H

/* fn(arg, i) for i = 0 .. items - 1, on the calling thread and the pool's helpers, in any order
 * and split: each item must write only its own outputs. Returns when every item is done. */
void parallel_for(void (*fn)(void *arg, long item), void *arg, long items);

#endif
