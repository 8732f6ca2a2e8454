"""The last module of a Ray worker's preload list (warmpool.preload_modules): its import time,
``AT_S``, is when the worker finished importing what a replica needs, before it waited in Ray's
pool. Nothing imports it otherwise, so a worker that was not preloaded does not have it."""

import time

AT_S = time.time()
