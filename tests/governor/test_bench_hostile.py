"""`governor bench hostile` against a real `governor serve`: each hostile request gets its 4xx, naming the field
where there is one (a body that is not UTF-8 has no fields to name)."""
BENCH = ["hostile", "--body-mb", "3", "--repeats", "1"]
RESULT = "hostile"


def test_each_hostile_request_gets_its_4xx_naming_the_field(data):
    answers = {name: (summary["statuses"], summary["params"]) for name, summary in data["requests"].items()}
    assert answers == {"declared_body": ([413], ["body"]), "streamed_body": ([413], ["body"]),
                       "lone_surrogate": ([400], ["prompt"]), "invalid_utf8": ([400], ["None"])}


def test_records_seconds_and_rss_growth_of_every_request(data):
    for summary in data["requests"].values():
        [row] = summary["rows"]
        assert row["seconds"] > 0 and summary["max_seconds"] == row["seconds"]
        assert summary["max_rss_growth_mb"] == row["rss_growth_mb"]


def test_writes_a_plot(out):
    assert (out / "hostile.png").stat().st_size > 10_000
