from serve_app.ops.cli import main

raise SystemExit(main())
