from serve_app.ops.cli import main

# A guard: multiprocessing's spawned children (serve-app plan's load clients) import this
# module as __mp_main__, and must not run the command again.
if __name__ == "__main__":
    raise SystemExit(main())
