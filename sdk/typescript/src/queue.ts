/** A queue read as an async iterator: what a callback-driven source (a socket) pushes, a `for await` loop pulls. */
export class AsyncQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private waiting: ((result: IteratorResult<T>) => void) | undefined;
  private failWaiting: ((error: unknown) => void) | undefined;
  private ended = false;
  private error: unknown;

  /** Adds an item (ignored once ended). */
  push(item: T): void {
    if (this.ended) return;
    if (this.waiting !== undefined) {
      const resolve = this.waiting;
      this.waiting = this.failWaiting = undefined;
      resolve({ value: item, done: false });
    } else {
      this.items.push(item);
    }
  }

  /** Ends the queue: readers get what is left, then the end (or `error`, if given). */
  end(error?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.error = error;
    if (this.waiting !== undefined) {
      const [resolve, reject] = [this.waiting, this.failWaiting];
      this.waiting = this.failWaiting = undefined;
      if (error === undefined) resolve({ value: undefined, done: true });
      else reject?.(error);
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return {
      next: () => {
        const item = this.items.shift();
        if (item !== undefined) return Promise.resolve({ value: item, done: false });
        if (this.ended) {
          return this.error === undefined
            ? Promise.resolve({ value: undefined, done: true })
            : Promise.reject(this.error);
        }
        return new Promise((resolve, reject) => {
          this.waiting = resolve;
          this.failWaiting = reject;
        });
      },
    };
  }
}
