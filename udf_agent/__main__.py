from udf_agent.cli import main

main()
