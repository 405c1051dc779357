/* An emulated CUDA stream, shared by the stand-in runtime (emu_cudart.c,
 * linked into the daemon) and the stand-in libnccl (fake_nccl.c, loaded
 * with dlopen): one worker thread runs the operations queued on it, one
 * after another, as a GPU runs a stream's work in order.  An operation
 * returns nonzero when it failed; the stream then stays failed, and the
 * operations after it are called with skip set, only to free arg. */
#ifndef RS_EMU_STREAM_H
#define RS_EMU_STREAM_H

struct emu_stream {
	/* Queues fn(arg) behind what is queued; 0, or -1 out of memory. */
	int (*enqueue)(struct emu_stream *s, int (*fn)(void *arg, int skip),
		       void *arg);
};

#endif
