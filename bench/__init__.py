"""The benchmark: the service against a floor app on the same stack, at two database sizes.

`python -m bench.run` is the one command; `bench.floor` is the floor app it serves beside the
service. Nothing here is imported by the service or run by the test suite.
"""
