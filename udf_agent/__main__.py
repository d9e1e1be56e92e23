from udf_agent.entry import main

main()
