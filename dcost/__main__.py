from dcost.cli.app import run

run()
