from benchmarks.dynspec_bench.testing.fake_server import main

main()
