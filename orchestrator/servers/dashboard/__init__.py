"""The lab dashboard: data.py assembles page data from etlab's typed records, pages.py renders it, app.py serves
it (`fab dashboard`), static.py writes it as files (`fab dashboard --static DIR`, and next to each nightly report)."""
