"""Schema migrations, applied in numeric order by `orchestra db upgrade` and at server start."""
