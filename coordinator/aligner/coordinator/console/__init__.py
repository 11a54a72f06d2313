"""``aligner console``: the chain seen live in a browser.

:mod:`.picture` reads what the page shows, :mod:`.hub` keeps one picture for every viewer and wakes on
ZooKeeper watches, :mod:`.actions` runs the CLI's own commands for a page, :mod:`.app` serves the page, the
JSON API and the event stream, :mod:`.server` runs it under uvicorn until SIGTERM."""
