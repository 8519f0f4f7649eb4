from lambdactl.cli import main

main()
